package policy

import (
	"errors"
	"regexp"
	"strings"

	"github.com/distribution/reference"
	"github.com/opencontainers/go-digest"
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
//
// The company's imageAllowList is its own; the operator's (Operator.ImageAllowList) binds it
// too, so the effective list is their intersection: the image must match both (an empty list
// binds nothing). The image must also be a valid reference (the distribution grammar), or the
// error is a *ValidationError naming the config field it came from.
func (o Operator) ResolveImage(override string, defaults AdapterDefaults, cfg Config) (string, error) {
	image, field := override, "image"
	if override == "" {
		image, field = defaults.RuntimeImage, imageSource(defaults.AdapterType, cfg)
		if cfg.ImageRegistry != "" {
			image, field = RewriteRegistry(image, cfg.ImageRegistry), "imageRegistry"
		}
	}
	if msg := checkImageReference(image); msg != "" {
		var errs fieldErrors
		errs.add(field, msg)
		return "", errs.err()
	}
	if (override != "" || len(cfg.ImageAllowList) > 0) && !allowed(image, cfg.ImageAllowList) {
		e := &ImageNotAllowedError{Image: image, Field: "imageAllowList"}
		if override == "" {
			e.Adapter = defaults.AdapterType
		}
		return "", e
	}
	if len(o.ImageAllowList) > 0 && !allowed(image, o.ImageAllowList) {
		return "", &ImageNotAllowedError{Image: image, Adapter: defaults.AdapterType, Field: field, Operator: o.ImageAllowList}
	}
	return image, nil
}

// imageSource names the config field an adapter's image comes from: its registry entry's
// runtimeImage, or adapterType for a built-in.
func imageSource(adapterType string, cfg Config) string {
	for i, a := range cfg.Adapters {
		if a.AdapterType == adapterType {
			return indexPath("adapters", i) + ".runtimeImage"
		}
	}
	return "adapterType"
}

// checkImageReference says why ref is not an image reference a kubelet can pull (the
// distribution reference grammar: lowercase repository path, optional tag, optional digest of a
// known algorithm), "" when it is. The reason names the broken part, never echoing the value.
func checkImageReference(ref string) string {
	const rule = "must be an image reference such as ghcr.io/org/image:tag or ghcr.io/org/image@sha256:<64 hex digits>"
	if ref == "" {
		return "required"
	}
	name, _, _ := strings.Cut(ref, "@")
	if i := strings.LastIndexByte(name, ':'); i > strings.LastIndexByte(name, '/') {
		name = name[:i]
	}
	if strings.ToLower(name) != name {
		// The library reports this with the value in its text; say it without.
		return rule + ": " + reference.ErrNameContainsUppercase.Error()
	}
	_, err := reference.ParseNormalizedNamed(ref)
	if err == nil {
		return ""
	}
	for _, known := range []error{
		reference.ErrNameContainsUppercase, reference.ErrNameTooLong, reference.ErrNameEmpty,
		reference.ErrTagInvalidFormat, reference.ErrDigestInvalidFormat,
	} {
		if errors.Is(err, known) {
			return rule + ": " + known.Error()
		}
	}
	if errors.Is(err, digest.ErrDigestInvalidLength) || errors.Is(err, digest.ErrDigestUnsupported) || errors.Is(err, digest.ErrDigestInvalidFormat) {
		return rule + ": invalid digest"
	}
	return rule + ": invalid reference format"
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
