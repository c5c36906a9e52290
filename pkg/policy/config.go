package policy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strconv"

	"github.com/kubeclip/kubeclip/pkg/strictjson"
)

// EgressMode chooses how a tenant's egress allow-list is enforced.
type EgressMode string

// The egress modes of the provider config.
const (
	// EgressStandard renders a Kubernetes NetworkPolicy (CIDR-only; FQDNs fall back to public
	// IPv4 on 80/443).
	EgressStandard EgressMode = "standard"
	// EgressCilium renders a CiliumNetworkPolicy with toFQDNs rules.
	EgressCilium EgressMode = "cilium"
)

// Backend chooses the workload kind of a run.
type Backend string

// The backends of the provider config.
const (
	BackendSandboxCR Backend = "sandbox-cr"
	BackendJob       Backend = "job"
	// BackendPod is kubeclip's own exec-capable lease for clusters without agent-sandbox: a
	// bare Pod whose main process is sandboxd, alive for the lease (docs/exec.md).
	BackendPod Backend = "pod"
)

// ExecCapable reports whether leases of backend b run commands on request (sandboxd as the
// pod's main process) rather than the agent as the main process.
func (b Backend) ExecCapable() bool { return b == BackendPod || b == BackendSandboxCR }

// Defaults of the provider config (types.ts plus kubeclip's two server fields).
const (
	DefaultNamespacePrefix            = "paperclip-"
	DefaultEgressMode                 = EgressStandard
	DefaultJobTTLSecondsAfterFinished = 900
	DefaultPodActivityDeadlineSec     = 3600
	DefaultAdapterType                = "claude_local"
	DefaultBackend                    = BackendSandboxCR
	DefaultPaperclipServerNamespace   = "paperclip"

	// MaxPodActivityDeadlineSec bounds podActivityDeadlineSec: a week is far beyond any agent
	// run, and every duration derived from it (the agent guard's TTL, a pod's deadline) stays
	// well inside time.Duration and the lease records' 14-day life.
	MaxPodActivityDeadlineSec = 7 * 24 * 60 * 60
)

// DefaultPaperclipServerPodLabels selects the Paperclip server pods that agents call back on
// TCP 3100. Upstream hard-codes them (paperclip#9053); kubeclip makes them configurable.
func DefaultPaperclipServerPodLabels() map[string]string {
	return map[string]string{"app": "paperclip-server"}
}

// Config is the Kubernetes provider config of a lease, with defaults applied. Its JSON form is
// the normalized config (field names as in Paperclip's zod schema).
type Config struct {
	NamespacePrefix           string             `json:"namespacePrefix"`
	CompanySlug               string             `json:"companySlug,omitempty"`
	ImageRegistry             string             `json:"imageRegistry,omitempty"`
	ImageAllowList            []string           `json:"imageAllowList"`
	ImagePullSecrets          []string           `json:"imagePullSecrets"`
	EgressAllowFqdns          []string           `json:"egressAllowFqdns"`
	EgressAllowCidrs          []string           `json:"egressAllowCidrs"`
	EgressMode                EgressMode         `json:"egressMode"`
	DefaultResources          *ResourceOverrides `json:"defaultResources,omitempty"`
	RuntimeClassName          string             `json:"runtimeClassName,omitempty"`
	ServiceAccountAnnotations map[string]string  `json:"serviceAccountAnnotations"`
	// int32 because Job.spec.ttlSecondsAfterFinished is.
	JobTTLSecondsAfterFinished int32             `json:"jobTtlSecondsAfterFinished"`
	PodActivityDeadlineSec     int64             `json:"podActivityDeadlineSec"`
	AdapterType                string            `json:"adapterType"`
	Adapters                   []AdapterEntry    `json:"adapters,omitempty"`
	Backend                    Backend           `json:"backend"`
	PaperclipServerNamespace   string            `json:"paperclipServerNamespace"`
	PaperclipServerPodLabels   map[string]string `json:"paperclipServerPodLabels"`
}

// ResourceOverrides is `defaultResources`: per-field overrides of the agent container's
// requests and limits. Empty strings mean "keep the default".
type ResourceOverrides struct {
	Requests *ResourceList `json:"requests,omitempty"`
	Limits   *ResourceList `json:"limits,omitempty"`
}

// ResourceList holds Kubernetes quantities as written in the config.
type ResourceList struct {
	CPU    string `json:"cpu,omitempty"`
	Memory string `json:"memory,omitempty"`
}

// DefaultConfig returns the config an empty `{}` parses to.
func DefaultConfig() Config {
	return Config{
		NamespacePrefix:            DefaultNamespacePrefix,
		ImageAllowList:             []string{},
		ImagePullSecrets:           []string{},
		EgressAllowFqdns:           []string{},
		EgressAllowCidrs:           []string{},
		EgressMode:                 DefaultEgressMode,
		ServiceAccountAnnotations:  map[string]string{},
		JobTTLSecondsAfterFinished: DefaultJobTTLSecondsAfterFinished,
		PodActivityDeadlineSec:     DefaultPodActivityDeadlineSec,
		AdapterType:                DefaultAdapterType,
		Backend:                    DefaultBackend,
		PaperclipServerNamespace:   DefaultPaperclipServerNamespace,
		PaperclipServerPodLabels:   DefaultPaperclipServerPodLabels(),
	}
}

// ParseConfig decodes a lease's provider config (a JSON object), applies defaults and validates
// it. Problems are reported together, each naming its field, in a *ValidationError: first every
// shape problem (wrong JSON type, unknown field, non-integer number), and, when the shape is
// right, every problem Config.Validate finds.
//
// Empty input (no bytes, or only whitespace) is the empty object: every field has a default.
// Deviations from the zod schema (types.ts), each deliberate:
//   - `inCluster` and `kubeconfig` are rejected: cluster credentials belong to the kubeclip
//     workers, not to a lease. So the schema's "requires one of inCluster or kubeconfig" refine
//     is gone too.
//   - unknown fields are rejected everywhere (zod's z.object strips them silently, except in
//     adapter entries, which are .strict()).
//   - the added fields `paperclipServerNamespace` and `paperclipServerPodLabels` (paperclip#9053).
//   - many fields are checked for what Kubernetes would reject later; see Config.Validate.
func ParseConfig(raw []byte) (Config, error) {
	cfg := DefaultConfig()
	var errs fieldErrors
	var doc any = map[string]any{}
	if len(bytes.TrimSpace(raw)) > 0 {
		var ok bool
		if doc, ok = decodeJSON(raw, "config", "", &errs); !ok {
			return Config{}, errs.err()
		}
	}
	d := decoder{errs: &errs}
	d.config(doc, &cfg)
	if len(errs) > 0 {
		return Config{}, errs.err()
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

// decodeJSON decodes one JSON value (JSON null is nil) with numbers kept as json.Number. A key
// given twice, or two keys differing only in case, are refused: decoding would keep one of
// them silently. field names the document in errors about all of it; root goes in front of a
// refused key's path, as the caller names the document's fields.
func decodeJSON(raw []byte, field, root string, errs *fieldErrors) (any, bool) {
	var keyErr *strictjson.KeyError
	if err := strictjson.CheckKeys(raw, root); errors.As(err, &keyErr) {
		errs.add(orRoot(keyErr.Path), keyErr.Reason)
		return nil, false
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		errs.add(field, "invalid JSON: "+jsonErrorText(err))
		return nil, false
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		errs.add(field, "invalid JSON: unexpected data after the top-level value")
		return nil, false
	}
	return v, true
}

// jsonErrorText describes a JSON syntax error by its offset only: encoding/json's messages can
// quote parts of the input, which may be a secret.
func jsonErrorText(err error) string {
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Sprintf("syntax error at byte %d", se.Offset)
	}
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return "unexpected end of input"
	}
	return "malformed document"
}

// decoder turns a decoded JSON value into typed fields, reporting type errors by path.
type decoder struct {
	errs *fieldErrors
}

// configFields lists the accepted top-level fields in the order they are checked.
var configFields = []string{
	"namespacePrefix", "companySlug", "imageRegistry", "imageAllowList", "imagePullSecrets",
	"egressAllowFqdns", "egressAllowCidrs", "egressMode", "defaultResources", "runtimeClassName",
	"serviceAccountAnnotations", "jobTtlSecondsAfterFinished", "podActivityDeadlineSec",
	"adapterType", "adapters", "backend", "paperclipServerNamespace", "paperclipServerPodLabels",
}

// credentialFields are fields of the upstream schema that kubeclip refuses in a lease.
var credentialFields = []string{"inCluster", "kubeconfig"}

func (d decoder) config(v any, cfg *Config) {
	obj, ok := d.object("", v, append(slices.Clone(configFields), credentialFields...))
	if !ok {
		return
	}
	for _, f := range credentialFields {
		if _, present := obj[f]; present {
			// Never echo the value: a kubeconfig holds credentials.
			d.errs.add(f, "not accepted in a lease's config: cluster credentials belong to the kubeclip workers")
		}
	}
	for _, f := range configFields {
		v, present := obj[f]
		if !present {
			continue
		}
		switch f {
		case "namespacePrefix":
			d.setString(f, v, &cfg.NamespacePrefix)
		case "companySlug":
			d.setString(f, v, &cfg.CompanySlug)
		case "imageRegistry":
			d.setString(f, v, &cfg.ImageRegistry)
		case "imageAllowList":
			d.setStrings(f, v, &cfg.ImageAllowList)
		case "imagePullSecrets":
			d.setStrings(f, v, &cfg.ImagePullSecrets)
		case "egressAllowFqdns":
			d.setStrings(f, v, &cfg.EgressAllowFqdns)
		case "egressAllowCidrs":
			d.setStrings(f, v, &cfg.EgressAllowCidrs)
		case "egressMode":
			var s string
			if d.setString(f, v, &s) {
				cfg.EgressMode = EgressMode(s)
			}
		case "defaultResources":
			cfg.DefaultResources = d.resources(f, v)
		case "runtimeClassName":
			d.setString(f, v, &cfg.RuntimeClassName)
		case "serviceAccountAnnotations":
			if m, ok := d.stringMap(f, v); ok {
				cfg.ServiceAccountAnnotations = m
			}
		case "jobTtlSecondsAfterFinished":
			if n, ok := d.integer(f, v, math.MaxInt32); ok {
				cfg.JobTTLSecondsAfterFinished = int32(n)
			}
		case "podActivityDeadlineSec":
			if n, ok := d.integer(f, v, maxSafeInteger); ok {
				cfg.PodActivityDeadlineSec = n
			}
		case "adapterType":
			d.setString(f, v, &cfg.AdapterType)
		case "adapters":
			if a, ok := d.adapters(f, v); ok {
				cfg.Adapters = a
			}
		case "backend":
			var s string
			if d.setString(f, v, &s) {
				cfg.Backend = Backend(s)
			}
		case "paperclipServerNamespace":
			d.setString(f, v, &cfg.PaperclipServerNamespace)
		case "paperclipServerPodLabels":
			if m, ok := d.stringMap(f, v); ok {
				cfg.PaperclipServerPodLabels = m
			}
		}
	}
}

var resourceListFields = []string{"cpu", "memory"}

func (d decoder) resources(path string, v any) *ResourceOverrides {
	obj, ok := d.object(path, v, []string{"requests", "limits"})
	if !ok {
		return nil
	}
	out := &ResourceOverrides{}
	for _, f := range []string{"requests", "limits"} {
		rv, present := obj[f]
		if !present {
			continue
		}
		p := joinPath(path, f)
		ro, ok := d.object(p, rv, resourceListFields)
		if !ok {
			continue
		}
		rl := &ResourceList{}
		for _, name := range resourceListFields {
			q, present := ro[name]
			if !present {
				continue
			}
			dst := &rl.CPU
			if name == "memory" {
				dst = &rl.Memory
			}
			// An empty string means "keep the default" in a typed ResourceList; in JSON it is a
			// mistake (zod accepts it, Kubernetes then rejects the pod).
			if d.setString(joinPath(p, name), q, dst) && *dst == "" {
				d.errs.add(joinPath(p, name), "must be a Kubernetes quantity such as 500m or 1Gi, got an empty string")
			}
		}
		if f == "requests" {
			out.Requests = rl
		} else {
			out.Limits = rl
		}
	}
	return out
}

var adapterEntryFields = []string{
	"adapterType", "enabled", "runtimeImage", "envKeys", "allowFqdns", "probeCommand", "defaultEnv",
}

func (d decoder) adapters(path string, v any) ([]AdapterEntry, bool) {
	arr, ok := v.([]any)
	if !ok {
		d.typeError(path, "an array", v)
		return nil, false
	}
	out := make([]AdapterEntry, 0, len(arr))
	before := len(*d.errs)
	for i, ev := range arr {
		p := indexPath(path, i)
		obj, ok := d.object(p, ev, adapterEntryFields)
		if !ok {
			continue
		}
		e := AdapterEntry{Enabled: true}
		if f, present := obj["adapterType"]; present {
			d.setString(joinPath(p, "adapterType"), f, &e.AdapterType)
		} else {
			d.errs.add(joinPath(p, "adapterType"), "required")
		}
		if f, present := obj["enabled"]; present {
			if b, ok := f.(bool); ok {
				e.Enabled = b
			} else {
				d.typeError(joinPath(p, "enabled"), "a boolean", f)
			}
		}
		if f, present := obj["runtimeImage"]; present {
			d.setString(joinPath(p, "runtimeImage"), f, &e.RuntimeImage)
		}
		if f, present := obj["envKeys"]; present {
			d.setStrings(joinPath(p, "envKeys"), f, &e.EnvKeys)
		}
		if f, present := obj["allowFqdns"]; present {
			d.setStrings(joinPath(p, "allowFqdns"), f, &e.AllowFqdns)
		}
		if f, present := obj["probeCommand"]; present {
			d.setStrings(joinPath(p, "probeCommand"), f, &e.ProbeCommand)
		}
		if f, present := obj["defaultEnv"]; present {
			if m, ok := d.stringMap(joinPath(p, "defaultEnv"), f); ok {
				e.DefaultEnv = m
			}
		}
		out = append(out, e)
	}
	return out, len(*d.errs) == before
}

// object checks that v is a JSON object whose keys are all in allowed; unknown keys are
// reported (sorted, so the error is stable).
func (d decoder) object(path string, v any, allowed []string) (map[string]any, bool) {
	obj, ok := v.(map[string]any)
	if !ok {
		d.typeError(orRoot(path), "an object", v)
		return nil, false
	}
	for _, k := range slices.Sorted(maps.Keys(obj)) {
		if !slices.Contains(allowed, k) {
			d.errs.add(joinPath(path, k), "unknown field")
		}
	}
	return obj, true
}

func (d decoder) setString(path string, v any, dst *string) bool {
	s, ok := v.(string)
	if !ok {
		d.typeError(path, "a string", v)
		return false
	}
	*dst = s
	return true
}

// setStrings sets *dst only when every element is a string, so later checks see the indexes
// the caller wrote.
func (d decoder) setStrings(path string, v any, dst *[]string) bool {
	arr, ok := v.([]any)
	if !ok {
		d.typeError(path, "an array of strings", v)
		return false
	}
	out := make([]string, 0, len(arr))
	good := true
	for i, ev := range arr {
		s, ok := ev.(string)
		if !ok {
			d.typeError(indexPath(path, i), "a string", ev)
			good = false
			continue
		}
		out = append(out, s)
	}
	if good {
		*dst = out
	}
	return good
}

// stringMap decodes an object of strings. Values are never echoed (annotations and defaultEnv
// may hold secrets), only their JSON kind.
func (d decoder) stringMap(path string, v any) (map[string]string, bool) {
	obj, ok := v.(map[string]any)
	if !ok {
		d.typeError(path, "an object of strings", v)
		return nil, false
	}
	out := make(map[string]string, len(obj))
	good := true
	for _, k := range slices.Sorted(maps.Keys(obj)) {
		s, ok := obj[k].(string)
		if !ok {
			d.typeError(keyPath(path, k), "a string", obj[k])
			good = false
			continue
		}
		out[k] = s
	}
	return out, good
}

// maxSafeInteger is JavaScript's Number.MAX_SAFE_INTEGER: above it a JSON number no longer
// names one integer.
const maxSafeInteger = 1<<53 - 1

// integer accepts a JSON number that is a whole number, like zod's z.number().int(): 1.5 is
// rejected, 1e3 and 2.0 are 1000 and 2 (JavaScript reads them as the same double). Range checks
// beyond max are Validate's job.
func (d decoder) integer(path string, v any, max int64) (int64, bool) {
	num, ok := v.(json.Number)
	if !ok {
		d.typeError(path, "a number", v)
		return 0, false
	}
	f, err := strconv.ParseFloat(string(num), 64)
	if err != nil || math.IsInf(f, 0) {
		d.errs.add(path, "number is out of range")
		return 0, false
	}
	if f != math.Trunc(f) {
		d.errs.add(path, "must be an integer, got "+string(num))
		return 0, false
	}
	if f > float64(max) {
		d.errs.add(path, fmt.Sprintf("must be at most %d", max))
		return 0, false
	}
	if f < -maxSafeInteger {
		d.errs.add(path, "number is out of range")
		return 0, false
	}
	return int64(f), true
}

func (d decoder) typeError(path, want string, got any) {
	d.errs.add(orRoot(path), "expected "+want+", got "+jsonKind(got))
}

func jsonKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "boolean"
	case json.Number, float64:
		return "number"
	case string:
		return "string"
	case []any:
		return "array"
	case map[string]any:
		return "object"
	}
	return fmt.Sprintf("%T", v)
}

// joinPath appends an object key to a JSON path: `a.b` for identifier-like keys, `a["x/y"]`
// otherwise (the same form strictjson names refused keys in).
func joinPath(parent, key string) string { return strictjson.Join(parent, key) }

// keyPath appends a map key in bracket form: `serviceAccountAnnotations["example.com/a"]`.
func keyPath(parent, key string) string {
	return parent + "[" + strconv.Quote(key) + "]"
}

func indexPath(parent string, i int) string {
	return parent + "[" + strconv.Itoa(i) + "]"
}

func orRoot(path string) string {
	if path == "" {
		return "config"
	}
	return path
}

// quoteShort quotes a user value for an error message, cut to 80 bytes. Use it only for values
// that are not secret by nature (names, CIDRs, enum values).
func quoteShort(s string) string {
	const max = 80
	if len(s) > max {
		s = s[:max] + "..."
	}
	return strconv.Quote(s)
}
