package k8s

// IsPermanent reports whether the API server refused a request in a way a retry cannot fix
// (invalid, forbidden, malformed, not found, too large), so the worker fails the request
// instead of retrying it. Everything else (timeouts, 5xx, conflicts, throttling) is worth a
// retry.
func IsPermanent(err error) bool {
	return err != nil && isPermanentCreateError(err)
}
