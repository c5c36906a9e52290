package policy

import (
	"regexp"
	"strings"
)

// GlobMatch matches an image reference against an allowlist glob (image-allowlist.ts): `*`
// matches any run of characters except `/`, `?` matches one character except `/`, everything
// else is literal, and the whole reference must match.
func GlobMatch(pattern, value string) bool {
	var re strings.Builder
	re.WriteString("^")
	for _, r := range pattern {
		switch r {
		case '*':
			re.WriteString("[^/]*")
		case '?':
			re.WriteString("[^/]")
		default:
			re.WriteString(regexp.QuoteMeta(string(r)))
		}
	}
	re.WriteString("$")
	// QuoteMeta output always compiles.
	return regexp.MustCompile(re.String()).MatchString(value)
}

// ResolveImage picks a run's image (resolveImage): an override must match an imageAllowList
// glob (else *ImageNotAllowedError, errors.Is ErrImageNotAllowed) and is used as is; otherwise
// the adapter's runtime image, moved to imageRegistry when one is configured.
//
// Deviation: upstream checks the allowlist for overrides only, so a config could run any image
// through its adapters' runtimeImage or imageRegistry while its allowlist said otherwise. Here a
// non-empty imageAllowList binds the image the run will actually use, whichever way it was
// chosen.
func ResolveImage(override string, defaults AdapterDefaults, cfg Config) (string, error) {
	if override != "" {
		if !allowed(override, cfg.ImageAllowList) {
			return "", &ImageNotAllowedError{Image: override}
		}
		return override, nil
	}
	image := defaults.RuntimeImage
	if cfg.ImageRegistry != "" {
		image = RewriteRegistry(image, cfg.ImageRegistry)
	}
	if len(cfg.ImageAllowList) > 0 && !allowed(image, cfg.ImageAllowList) {
		return "", &ImageNotAllowedError{Image: image, Adapter: defaults.AdapterType}
	}
	return image, nil
}

func allowed(image string, globs []string) bool {
	for _, p := range globs {
		if GlobMatch(p, image) {
			return true
		}
	}
	return false
}

// RewriteRegistry moves image under registry (rewriteRegistry): the tag is everything from the
// last ':', the first two path segments (host and organisation) are dropped, and if nothing is
// left the last segment is kept. So ghcr.io/paperclipai/agent-runtime-claude:v1 under
// registry.example.com/mirror/ is registry.example.com/mirror/agent-runtime-claude:v1.
//
// Deviation: an http:// or https:// scheme on registry is dropped (upstream kept it, producing
// an image reference no runtime accepts).
func RewriteRegistry(image, registry string) string {
	for _, scheme := range []string{"https://", "http://"} {
		if strings.HasPrefix(registry, scheme) {
			registry = strings.TrimPrefix(registry, scheme)
			break
		}
	}
	clean := strings.TrimRight(registry, "/")
	tag, path := "", image
	if i := strings.LastIndex(image, ":"); i >= 0 {
		tag, path = image[i:], image[:i]
	}
	segments := strings.Split(path, "/")
	name := ""
	if len(segments) > 2 {
		name = strings.Join(segments[2:], "/")
	}
	if name == "" {
		name = segments[len(segments)-1]
	}
	return clean + "/" + name + tag
}
