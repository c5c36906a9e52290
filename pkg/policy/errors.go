package policy

import (
	"errors"
	"strings"
)

// FieldError is one problem with one field of an input. Field is a JSON path relative to the
// document that was parsed (`egressAllowCidrs[2]`, `adapters[0].runtimeImage`,
// `serviceAccountAnnotations["example.com/x"]`). Message never contains a secret value.
type FieldError struct {
	Field   string
	Message string
}

func (e FieldError) Error() string { return e.Field + ": " + e.Message }

// ValidationError lists every problem found in an input. Find it with errors.As.
type ValidationError struct {
	Errors []FieldError
}

// Error joins the field errors as `field: message; field: message`.
func (e *ValidationError) Error() string {
	parts := make([]string, len(e.Errors))
	for i, fe := range e.Errors {
		parts[i] = fe.Error()
	}
	return strings.Join(parts, "; ")
}

// Fields returns the names of the fields that failed, in order.
func (e *ValidationError) Fields() []string {
	out := make([]string, len(e.Errors))
	for i, fe := range e.Errors {
		out[i] = fe.Field
	}
	return out
}

// fieldErrors collects FieldErrors while an input is checked.
type fieldErrors []FieldError

func (l *fieldErrors) add(field, message string) {
	*l = append(*l, FieldError{Field: field, Message: message})
}

// err returns nil when nothing was collected, else a *ValidationError.
func (l fieldErrors) err() error {
	if len(l) == 0 {
		return nil
	}
	return &ValidationError{Errors: append([]FieldError(nil), l...)}
}

// Failure codes of Paperclip's `failed` run event that decisions in this package lead to.
const (
	CodeUnknownAdapter  = "unknown_adapter"
	CodeImageNotAllowed = "image_not_allowed"
)

var (
	// ErrUnknownAdapter means the run's adapter type is neither a built-in nor usable from the
	// configured registry. Match with errors.Is; the failed-event code is CodeUnknownAdapter.
	ErrUnknownAdapter = errors.New(CodeUnknownAdapter)
	// ErrImageNotAllowed means an image override matches no imageAllowList glob. The failed-event
	// code is CodeImageNotAllowed.
	ErrImageNotAllowed = errors.New(CodeImageNotAllowed)
	// ErrReservedEnvKey means adapter env tried to set a key kubeclip sets itself (BOOTSTRAP_TOKEN).
	ErrReservedEnvKey = errors.New("reserved env key")
	// ErrInvalidLeaseDeadline means a requested lease expiry is unparseable, past, or too close.
	ErrInvalidLeaseDeadline = errors.New("invalid lease deadline")
)

// AdapterError says why an adapter type cannot be used. It matches ErrUnknownAdapter.
// Message reproduces the TypeScript provider's wording.
type AdapterError struct {
	AdapterType string
	Message     string
}

func (e *AdapterError) Error() string { return e.Message }

// Is reports that every AdapterError is an ErrUnknownAdapter.
func (e *AdapterError) Is(target error) bool { return target == ErrUnknownAdapter }

// ImageNotAllowedError is returned for an image outside the allowlist: an override, or (with
// Adapter set) the image an adapter's runtimeImage and imageRegistry lead to. It matches
// ErrImageNotAllowed.
type ImageNotAllowedError struct {
	Image   string
	Adapter string
	// Field is the config field to change: imageAllowList when the company's own list refused
	// the image, else where the image came from (adapters[i].runtimeImage, imageRegistry,
	// adapterType).
	Field string
	// Operator is the operator's allow list when it, not the company's, refused the image.
	Operator []string
}

func (e *ImageNotAllowedError) Error() string {
	if len(e.Operator) > 0 {
		return `Image "` + e.Image + `" is not an image this kubeclip installation allows (` + strings.Join(e.Operator, ", ") + `)`
	}
	if e.Adapter != "" {
		return `Image "` + e.Image + `" of adapter ` + e.Adapter + ` (its runtimeImage, after imageRegistry) is not in imageAllowList`
	}
	return `Image override "` + e.Image + `" is not in allowlist`
}

// Is reports that every ImageNotAllowedError is an ErrImageNotAllowed.
func (e *ImageNotAllowedError) Is(target error) bool { return target == ErrImageNotAllowed }
