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
func ResolveImage(override string, defaults AdapterDefaults, cfg Config) (string, error) {
	if override != "" {
		for _, p := range cfg.ImageAllowList {
			if GlobMatch(p, override) {
				return override, nil
			}
		}
		return "", &ImageNotAllowedError{Image: override}
	}
	if cfg.ImageRegistry != "" {
		return RewriteRegistry(defaults.RuntimeImage, cfg.ImageRegistry), nil
	}
	return defaults.RuntimeImage, nil
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
