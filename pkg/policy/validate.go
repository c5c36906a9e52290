package policy

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
)

var (
	// namespacePrefixRE and companySlugRE are the zod regexes of types.ts.
	namespacePrefixRE = regexp.MustCompile(`^[a-z0-9-]{1,32}$`)
	companySlugRE     = regexp.MustCompile(`^[a-z0-9-]{1,32}$`)
)

// Validate checks a Config the way ParseConfig does after decoding, so a Config built in code
// gets the same checks. Every problem is reported in a *ValidationError naming its field.
//
// Beyond the zod schema, Validate rejects what Kubernetes (or Cilium) would reject later, so a
// bad config fails when the lease is parsed rather than half-way through provisioning. Each
// such check is marked "Deviation:" below.
func (c Config) Validate() error {
	var errs fieldErrors

	if !namespacePrefixRE.MatchString(c.NamespacePrefix) {
		errs.add("namespacePrefix", "must be 1-32 characters of a-z, 0-9 and '-'")
	} else if c.NamespacePrefix[0] == '-' {
		// Deviation: zod allows a leading '-', which no namespace name can start with.
		errs.add("namespacePrefix", "must start with a lowercase letter or digit (it begins the namespace name)")
	}

	if c.CompanySlug != "" {
		switch {
		case !companySlugRE.MatchString(c.CompanySlug):
			errs.add("companySlug", "must be 1-32 characters of a-z, 0-9 and '-'")
		case strings.HasPrefix(c.CompanySlug, "-") || strings.HasSuffix(c.CompanySlug, "-"):
			// Deviation: zod allows leading/trailing '-', which makes an invalid namespace name.
			errs.add("companySlug", "must not start or end with '-'")
		case len(c.NamespacePrefix)+len(c.CompanySlug) > validation.DNS1123LabelMaxLength:
			// Deviation: upstream never checks the combined length (utils.ts).
			errs.add("companySlug", fmt.Sprintf("namespacePrefix + companySlug is %d characters; a namespace name is at most 63",
				len(c.NamespacePrefix)+len(c.CompanySlug)))
		}
	}

	if c.ImageRegistry != "" {
		if msg := checkRegistry(c.ImageRegistry); msg != "" {
			errs.add("imageRegistry", msg)
		}
	}

	// imageAllowList: any string is a glob (parity with zod).
	withinBound(&errs, "imageAllowList", len(c.ImageAllowList), MaxImageAllowList)

	for i, s := range boundedList(&errs, "imagePullSecrets", c.ImagePullSecrets, MaxSmallMap) {
		// Deviation: Kubernetes requires a Secret name (DNS-1123 subdomain); zod takes any string.
		if msg := checkDNSSubdomain(s); msg != "" {
			errs.add(indexPath("imagePullSecrets", i), msg)
		}
	}
	for i, s := range boundedList(&errs, "egressAllowFqdns", c.EgressAllowFqdns, MaxEgressEntries) {
		// Deviation: zod takes any string; Cilium rejects names that are not DNS names.
		if msg := checkFQDN(s); msg != "" {
			errs.add(indexPath("egressAllowFqdns", i), msg)
		}
	}
	for i, s := range boundedList(&errs, "egressAllowCidrs", c.EgressAllowCidrs, MaxEgressEntries) {
		// Deviation: a real IPv4 CIDR check (zod's regex takes 999.1.1.1/99); see checkIPv4CIDR.
		if msg := checkIPv4CIDR(s); msg != "" {
			errs.add(indexPath("egressAllowCidrs", i), msg)
		}
	}

	if c.EgressMode != EgressStandard && c.EgressMode != EgressCilium {
		errs.add("egressMode", fmt.Sprintf("must be one of %q, %q, got %s", EgressCilium, EgressStandard, quoteShort(string(c.EgressMode))))
	}

	c.validateResources(&errs)

	if c.RuntimeClassName != "" {
		// Deviation: Kubernetes requires a RuntimeClass name (DNS-1123 subdomain).
		if msg := checkDNSSubdomain(c.RuntimeClassName); msg != "" {
			errs.add("runtimeClassName", msg)
		}
	}

	total := 0
	for _, k := range boundedKeys(&errs, "serviceAccountAnnotations", c.ServiceAccountAnnotations, MaxSmallMap) {
		total += len(k) + len(c.ServiceAccountAnnotations[k])
		// Deviation: Kubernetes validates annotation keys as qualified names (case-insensitively).
		if msg := checkAnnotationKey(k); msg != "" {
			errs.add(keyPath("serviceAccountAnnotations", k), msg)
		}
	}
	if total > totalAnnotationSizeLimit {
		errs.add("serviceAccountAnnotations", fmt.Sprintf("total size %d bytes exceeds Kubernetes' limit of %d", total, totalAnnotationSizeLimit))
	}

	if c.JobTTLSecondsAfterFinished < 0 {
		errs.add("jobTtlSecondsAfterFinished", "must be >= 0")
	}
	if c.PodActivityDeadlineSec <= 0 {
		errs.add("podActivityDeadlineSec", "must be > 0")
	} else if c.PodActivityDeadlineSec > MaxPodActivityDeadlineSec {
		// Deviation: zod takes any safe integer; the deadline becomes TTLs (the agent guard,
		// the lease) that must not overflow or outlive the lease records.
		errs.add("podActivityDeadlineSec", fmt.Sprintf("must be at most %d (7 days)", MaxPodActivityDeadlineSec))
	}

	c.validateAdapterType(&errs)
	if withinBound(&errs, "adapters", len(c.Adapters), MaxAdapters) {
		validateAdapterEntries(c.Adapters, &errs)
	}

	if c.Backend != BackendSandboxCR && c.Backend != BackendJob && c.Backend != BackendPod {
		// Deviation: "pod" is kubeclip's own exec-capable lease (docs/exec.md).
		errs.add("backend", fmt.Sprintf("must be one of %q, %q, %q, got %s", BackendSandboxCR, BackendJob, BackendPod, quoteShort(string(c.Backend))))
	}

	if msg := checkDNSLabel(c.PaperclipServerNamespace); msg != "" {
		errs.add("paperclipServerNamespace", msg)
	}
	if len(c.PaperclipServerPodLabels) == 0 {
		// Deviation: an empty label selector selects every pod, so the egress rule for the
		// server's callback port would open it on every pod of that namespace.
		errs.add("paperclipServerPodLabels", fmt.Sprintf("must select the Paperclip server's pods with at least one label: an empty selector would let tenant pods reach every pod of namespace %s on port %d",
			quoteShort(c.PaperclipServerNamespace), paperclipServerPort))
	}
	for _, k := range boundedKeys(&errs, "paperclipServerPodLabels", c.PaperclipServerPodLabels, MaxSmallMap) {
		if msg := checkLabelKey(k); msg != "" {
			errs.add(keyPath("paperclipServerPodLabels", k), msg)
		} else if msg := checkLabelValue(c.PaperclipServerPodLabels[k]); msg != "" {
			errs.add(keyPath("paperclipServerPodLabels", k), msg)
		}
	}
	return errs.err()
}

// totalAnnotationSizeLimit is apimachinery's api/validation.TotalAnnotationSizeLimitB.
const totalAnnotationSizeLimit = 256 * (1 << 10)

// The agent container's default resources (pod-spec-builder.ts) and the tenant LimitRange
// bounds (tenant-orchestrator.ts).
var (
	defaultRequests = ResourceList{CPU: "250m", Memory: "512Mi"}
	defaultLimits   = ResourceList{CPU: "2", Memory: "4Gi"}
	limitRangeMin   = ResourceList{CPU: "100m", Memory: "128Mi"}
	limitRangeMax   = ResourceList{CPU: "4", Memory: "8Gi"}
	limitRangeDef   = ResourceList{CPU: "1", Memory: "2Gi"}
	limitRangeDefRq = ResourceList{CPU: "250m", Memory: "512Mi"}
)

func (r *ResourceList) get(name string) string {
	if r == nil {
		return ""
	}
	if name == "cpu" {
		return r.CPU
	}
	return r.Memory
}

// validateResources checks each override parses, and (Deviation: Kubernetes' LimitRanger and
// pod validation would reject it later) that the effective request and limit of each resource
// lie within the tenant LimitRange and request <= limit.
func (c Config) validateResources(errs *fieldErrors) {
	var reqs, lims *ResourceList
	if c.DefaultResources != nil {
		reqs, lims = c.DefaultResources.Requests, c.DefaultResources.Limits
	}
	for _, name := range resourceListFields {
		reqPath := "defaultResources.requests." + name
		limPath := "defaultResources.limits." + name
		req, reqOK := checkQuantity(reqs.get(name), defaultRequests.get(name), name, reqPath, errs)
		lim, limOK := checkQuantity(lims.get(name), defaultLimits.get(name), name, limPath, errs)
		if !reqOK || !limOK || req.Cmp(lim) <= 0 {
			continue
		}
		if reqs.get(name) != "" {
			errs.add(reqPath, fmt.Sprintf("request %s exceeds the limit %s", req.String(), lim.String()))
		} else {
			errs.add(limPath, fmt.Sprintf("limit %s is below the default request %s", lim.String(), req.String()))
		}
	}
}

// checkQuantity parses an override (or the default when it is empty) and checks it against the
// LimitRange. ok is false when the value is unusable or already reported.
func checkQuantity(override, def, name, path string, errs *fieldErrors) (resource.Quantity, bool) {
	if override == "" {
		return resource.MustParse(def), true
	}
	q, err := resource.ParseQuantity(override)
	if err != nil {
		errs.add(path, "must be a Kubernetes quantity such as 500m or 1Gi, got "+quoteShort(override))
		return q, false
	}
	if q.Sign() < 0 {
		errs.add(path, "must not be negative")
		return q, false
	}
	if min := resource.MustParse(limitRangeMin.get(name)); q.Cmp(min) < 0 {
		errs.add(path, fmt.Sprintf("%s is below the tenant LimitRange minimum %s", q.String(), min.String()))
		return q, false
	}
	if max := resource.MustParse(limitRangeMax.get(name)); q.Cmp(max) > 0 {
		errs.add(path, fmt.Sprintf("%s exceeds the tenant LimitRange maximum %s", q.String(), max.String()))
		return q, false
	}
	return q, true
}

// validateAdapterType checks the config's default adapter type.
//
// Deviation (fix of a zod quirk): upstream accepts only the six built-ins even when an
// `adapters` registry is configured, so a registry-only adapter cannot be the default. kubeclip
// accepts a built-in or a type declared in `adapters`. Because a non-empty registry REPLACES
// the built-ins (adapter-defaults.ts), a built-in name that the registry does not declare would
// make every run without an override fail with unknown_adapter, so with a registry the type
// must be declared there (and have a runtimeImage).
func (c Config) validateAdapterType(errs *fieldErrors) {
	if c.AdapterType == "" {
		errs.add("adapterType", "must not be empty")
		return
	}
	if len(c.Adapters) == 0 {
		if _, ok := builtinAdapters[c.AdapterType]; !ok {
			errs.add("adapterType", fmt.Sprintf("must be a built-in adapter type (%s) or declared in adapters, got %s",
				strings.Join(BuiltinAdapterTypes(), ", "), quoteShort(c.AdapterType)))
		}
		return
	}
	for i, e := range c.Adapters {
		if e.AdapterType == c.AdapterType {
			if e.RuntimeImage == "" {
				errs.add(indexPath("adapters", i)+".runtimeImage", fmt.Sprintf("required: %q is the default adapterType", c.AdapterType))
			}
			return
		}
	}
	errs.add("adapterType", fmt.Sprintf("%s is not declared in adapters (a configured adapter registry replaces the built-in adapters)", quoteShort(c.AdapterType)))
}

func validateAdapterEntries(entries []AdapterEntry, errs *fieldErrors) {
	seen := map[string]int{}
	for i, e := range entries {
		p := indexPath("adapters", i)
		switch {
		case e.AdapterType == "":
			errs.add(p+".adapterType", "must not be empty")
		case checkLabelValue(e.AdapterType) != "":
			// Deviation: the type becomes the paperclip.io/adapter label value.
			errs.add(p+".adapterType", "must be a valid label value (it labels the run's objects): "+labelValueRule)
		default:
			if j, dup := seen[e.AdapterType]; dup {
				// Deviation: upstream silently uses the first of two entries with one type.
				errs.add(p+".adapterType", fmt.Sprintf("duplicate of adapters[%d]", j))
			} else {
				seen[e.AdapterType] = i
			}
		}
		if e.RuntimeImage != "" {
			// Deviation: upstream takes any string; the kubelet would fail to pull it later.
			if msg := checkImageReference(e.RuntimeImage); msg != "" {
				errs.add(p+".runtimeImage", msg)
			}
		}
		for j, k := range boundedList(errs, p+".envKeys", e.EnvKeys, MaxAdapterEntries) {
			if msg := checkEnvKey(k); msg != "" {
				errs.add(indexPath(p+".envKeys", j), msg)
			}
		}
		boundedList(errs, p+".probeCommand", e.ProbeCommand, MaxAdapterEntries)
		for j, f := range boundedList(errs, p+".allowFqdns", e.AllowFqdns, MaxAdapterEntries) {
			if msg := checkFQDN(f); msg != "" {
				errs.add(indexPath(p+".allowFqdns", j), msg)
			}
		}
		for _, k := range boundedKeys(errs, p+".defaultEnv", e.DefaultEnv, MaxDefaultEnv) {
			// Only the key is checked and named; the value may be a secret.
			if msg := checkEnvKey(k); msg != "" {
				errs.add(keyPath(p+".defaultEnv", k), msg)
			}
		}
	}
}

// Rules quoted in error messages.
const (
	dnsLabelRule     = "lowercase letters, digits and '-', starting and ending with a letter or digit, at most 63 characters"
	dnsSubdomainRule = "lowercase letters, digits, '-' and '.', starting and ending with a letter or digit, at most 253 characters"
	labelValueRule   = "at most 63 characters of letters, digits, '-', '_' and '.', starting and ending with a letter or digit"
	qualifiedRule    = "an optional DNS subdomain prefix and '/', then a name of at most 63 characters of letters, digits, '-', '_' and '.', starting and ending with a letter or digit"
)

func checkDNSLabel(s string) string {
	if s == "" {
		return "must not be empty"
	}
	if len(validation.IsDNS1123Label(s)) > 0 {
		return "must be a DNS-1123 label: " + dnsLabelRule
	}
	return ""
}

func checkDNSSubdomain(s string) string {
	if s == "" {
		return "must not be empty"
	}
	if len(validation.IsDNS1123Subdomain(s)) > 0 {
		return "must be a DNS-1123 subdomain: " + dnsSubdomainRule
	}
	return ""
}

func checkLabelValue(s string) string {
	if len(validation.IsValidLabelValue(s)) > 0 {
		return "must be a valid label value: " + labelValueRule
	}
	return ""
}

func checkLabelKey(s string) string {
	if len(validation.IsQualifiedName(s)) > 0 {
		return "must be a valid label key: " + qualifiedRule
	}
	return ""
}

// checkAnnotationKey mirrors apimachinery's ValidateAnnotations: a qualified name, compared in
// lower case.
func checkAnnotationKey(s string) string {
	if len(validation.IsQualifiedName(strings.ToLower(s))) > 0 {
		return "must be a valid annotation key: " + qualifiedRule
	}
	return ""
}

// checkEnvKey accepts keys that are both a Secret data key and a classic environment variable
// name, and refuses BOOTSTRAP_TOKEN, which kubeclip sets itself.
func checkEnvKey(s string) string {
	if s == BootstrapTokenKey {
		return BootstrapTokenKey + " is reserved"
	}
	if len(validation.IsConfigMapKey(s)) > 0 || len(validation.IsEnvVarName(s)) > 0 {
		return "must be an environment variable name: letters, digits, '-', '.' and '_', not starting with a digit, at most 253 characters"
	}
	return ""
}

// checkFQDN accepts a DNS name (any case, no trailing dot), optionally behind one leading "*."
// wildcard label. (Deviation: zod takes any string.)
func checkFQDN(s string) string {
	name := strings.TrimPrefix(s, "*.")
	if strings.Contains(name, "*") {
		return "invalid DNS name " + quoteShort(s) + ": '*' is only allowed as a leading \"*.\" label"
	}
	if name == "" || len(validation.IsDNS1123Subdomain(strings.ToLower(name))) > 0 {
		return "invalid DNS name " + quoteShort(s) + ": want labels of letters, digits and '-' separated by '.', at most 253 characters"
	}
	return ""
}

// checkIPv4CIDR accepts an IPv4 CIDR a.b.c.d/n with octets 0-255 and n 0-32.
//
// Policy (each a Deviation from zod's /^(\d{1,3}\.){3}\d{1,3}\/\d{1,2}$/):
//   - octets and prefix length must be in range (zod: any 1-3 / 1-2 digits);
//   - leading zeros ("010.0.0.0/8", "/08") are rejected: some parsers read them as octal, Go's
//     net/netip rejects them, and Kubernetes 1.34 accepts them only with the warning "will be
//     considered invalid in a future Kubernetes release" (and rejects them under
//     StrictIPCIDRValidation);
//   - host bits beyond the prefix ("10.0.0.1/8") are rejected: Kubernetes 1.34 warns that such
//     a value "is ambiguous in this context (should be 10.0.0.0/8 or 10.0.0.1/32?)", and
//     rejects it under StrictIPCIDRValidation;
//   - IPv4 only, as upstream.
func checkIPv4CIDR(s string) string {
	bad := func(why string) string { return "invalid IPv4 CIDR " + quoteShort(s) + ": " + why }
	ip, prefix, ok := strings.Cut(s, "/")
	if !ok {
		return bad("missing /prefix-length (e.g. 10.0.0.0/8)")
	}
	if strings.Contains(ip, ":") {
		return bad("only IPv4 CIDRs are supported")
	}
	parts := strings.Split(ip, ".")
	if len(parts) != 4 {
		return bad("want four dot-separated octets")
	}
	var addr uint32
	for _, p := range parts {
		n, msg := decimal(p, 3)
		if msg != "" {
			return bad("octet " + quoteShort(p) + " " + msg)
		}
		if n > 255 {
			return bad(fmt.Sprintf("octet %d is out of range 0-255", n))
		}
		addr = addr<<8 | uint32(n)
	}
	bits, msg := decimal(prefix, 2)
	if msg != "" {
		return bad("prefix length " + quoteShort(prefix) + " " + msg)
	}
	if bits > 32 {
		return bad(fmt.Sprintf("prefix length %d is out of range 0-32", bits))
	}
	mask := uint32(0)
	if bits > 0 {
		mask = ^uint32(0) << (32 - bits)
	}
	if addr&^mask != 0 {
		net := addr & mask
		return bad(fmt.Sprintf("bits are set beyond the /%d prefix (did you mean %s/%d or %s/32?)", bits, ipv4String(net), bits, ip))
	}
	return ""
}

// decimal parses 1..maxDigits ASCII digits without a leading zero.
func decimal(s string, maxDigits int) (int, string) {
	if s == "" {
		return 0, "is empty"
	}
	if len(s) > maxDigits {
		return 0, fmt.Sprintf("has more than %d digits", maxDigits)
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return 0, "is not a decimal number"
		}
	}
	if len(s) > 1 && s[0] == '0' {
		return 0, "has a leading zero"
	}
	n, _ := strconv.Atoi(s)
	return n, ""
}

func ipv4String(a uint32) string {
	return fmt.Sprintf("%d.%d.%d.%d", a>>24, a>>16&0xff, a>>8&0xff, a&0xff)
}

var (
	registryHostLabelRE = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?$`)
	// registryPathRE is a repository path component of the distribution reference grammar.
	registryPathRE = regexp.MustCompile(`^[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*$`)
)

// checkRegistry accepts an http(s) URL or a bare host[:port][/path].
//
// Deviation: zod's .url() requires a URL, but upstream's rewriteRegistry pastes the value in
// front of the image path, so "https://r.example.com" produced the invalid image
// "https://r.example.com/agent-runtime-claude:v1". kubeclip also accepts the bare form image
// references use, and RewriteRegistry drops a URL's scheme. URLs with credentials, a query
// or a fragment are rejected (zod accepted them).
func checkRegistry(s string) string {
	rest := s
	if scheme, after, ok := strings.Cut(s, "://"); ok {
		if scheme != "http" && scheme != "https" {
			return "must be an http(s) URL or host[:port][/path], got scheme " + quoteShort(scheme)
		}
		rest = after
	}
	if strings.ContainsAny(rest, "@") {
		return "must not contain credentials"
	}
	if strings.ContainsAny(rest, "?#") {
		return "must not have a query or fragment"
	}
	rest = strings.TrimRight(rest, "/")
	hostport, path, _ := strings.Cut(rest, "/")
	host, port, hasPort := strings.Cut(hostport, ":")
	if host == "" {
		return "must be an http(s) URL or host[:port][/path]: missing host"
	}
	for _, label := range strings.Split(host, ".") {
		if !registryHostLabelRE.MatchString(label) {
			return "invalid registry host " + quoteShort(host)
		}
	}
	if hasPort {
		n, err := strconv.Atoi(port)
		if err != nil || n < 1 || n > 65535 || strings.HasPrefix(port, "0") {
			return "invalid registry port " + quoteShort(port)
		}
	}
	if path != "" {
		for _, comp := range strings.Split(path, "/") {
			if !registryPathRE.MatchString(comp) {
				return "invalid registry path component " + quoteShort(comp) + ": lowercase letters and digits separated by '.', '_', '__' or '-'"
			}
		}
	}
	return ""
}

// boundedList is l when it fits max, else nothing (the bound's error added): its entries are
// not worth checking one by one.
func boundedList(errs *fieldErrors, field string, l []string, max int) []string {
	if !withinBound(errs, field, len(l), max) {
		return nil
	}
	return l
}

// boundedKeys is boundedList for a map's keys, sorted.
func boundedKeys(errs *fieldErrors, field string, m map[string]string, max int) []string {
	if !withinBound(errs, field, len(m), max) {
		return nil
	}
	return sortedKeys(m)
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
