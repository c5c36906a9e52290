package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"slices"
	"sort"
	"strings"

	"github.com/kubeclip/kubeclip/pkg/broker"
	"github.com/kubeclip/kubeclip/pkg/broker/ca"
	"github.com/kubeclip/kubeclip/pkg/broker/proxy"
	"github.com/kubeclip/kubeclip/pkg/strictjson"
)

// bindingFile is one brokered key in the --bindings file:
//
//	{
//	  "ANTHROPIC_API_KEY": {
//	    "hosts": ["api.anthropic.com"],
//	    "headers": ["x-api-key", "authorization"],
//	    "errors": "anthropic",
//	    "upstreams": {"api.anthropic.com": "anthropic.internal:443"}
//	  }
//	}
//
// The file replaces the built-in defaults (defaultBindings) as a whole: what it lists is what is
// brokered, so an operator can also broker fewer keys.
type bindingFile struct {
	Hosts   []string `json:"hosts"`
	Headers []string `json:"headers"`
	// Errors is the error shape refusals answer in: anthropic, openai or google.
	Errors string `json:"errors"`
	// Upstreams overrides where the broker reaches a host (host:port); the upstream's
	// certificate is still checked for the host's name. For private endpoints and tests.
	Upstreams map[string]string `json:"upstreams,omitempty"`
}

// errorFormats are the values of "errors".
var errorFormats = map[string]proxy.ErrorFormat{
	"anthropic": proxy.ErrorsAnthropic,
	"openai":    proxy.ErrorsOpenAI,
	"google":    proxy.ErrorsGoogle,
}

// defaultBindings are the keys the adapters Paperclip runs read (claude_local, codex_local,
// opencode_local, gemini_local) and the hosts their CLIs call with them. Anthropic's CLI sends
// an API key in x-api-key and an auth token as Authorization: Bearer; OpenAI's SDKs send
// Bearer; Gemini's send x-goog-api-key.
func defaultBindings() map[string]bindingFile {
	google := bindingFile{Hosts: []string{"generativelanguage.googleapis.com"}, Headers: []string{string(broker.HeaderGoogAPIKey)}, Errors: "google"}
	return map[string]bindingFile{
		"ANTHROPIC_API_KEY": {Hosts: []string{"api.anthropic.com"}, Headers: []string{string(broker.HeaderXAPIKey), string(broker.HeaderAuthorization)}, Errors: "anthropic"},
		"OPENAI_API_KEY":    {Hosts: []string{"api.openai.com"}, Headers: []string{string(broker.HeaderAuthorization)}, Errors: "openai"},
		"GEMINI_API_KEY":    google,
		"GOOGLE_API_KEY":    google,
	}
}

// bindings are the brokered keys as the broker uses them: each key's binding (the mint
// service), and one route per bound host (the proxy).
type bindings struct {
	keys   map[string]broker.Binding
	routes []proxy.Route
}

// hosts are every bound host, sorted.
func (b bindings) hosts() []string {
	var hosts []string
	for _, r := range b.routes {
		hosts = append(hosts, r.Host)
	}
	sort.Strings(hosts)
	return hosts
}

// maxBindingsBytes bounds the --bindings file: a few keys of a few hosts each.
const maxBindingsBytes = 1 << 20

// loadBindings reads path ("" for the defaults). Errors name the field
// (`ANTHROPIC_API_KEY.headers[1]`), as the file spells it.
func loadBindings(path string) (bindings, error) {
	files := defaultBindings()
	if path != "" {
		data, err := os.ReadFile(path)
		if err != nil {
			return bindings{}, err
		}
		if len(data) > maxBindingsBytes {
			return bindings{}, fmt.Errorf("%s is %d bytes, more than %d", path, len(data), maxBindingsBytes)
		}
		if files, err = decodeBindings(data); err != nil {
			return bindings{}, fmt.Errorf("%s: %w", path, err)
		}
	}
	return compileBindings(files)
}

// decodeBindings reads the file strictly: valid JSON, no key twice or spelled unlike its field,
// no unknown field. Each key's object is checked on its own, so errors name it
// (ANTHROPIC_API_KEY.headers).
func decodeBindings(data []byte) (map[string]bindingFile, error) {
	if err := strictjson.CheckKeys(data, ""); err != nil {
		return nil, err
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, errors.New("must be a JSON object of brokered keys")
	}
	files := make(map[string]bindingFile, len(raw))
	for key, obj := range raw {
		if err := strictjson.CheckFields(obj, &bindingFile{}, key); err != nil {
			return nil, err
		}
		var f bindingFile
		dec := json.NewDecoder(bytes.NewReader(obj))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&f); err != nil {
			return nil, fmt.Errorf("%s: %w", key, err)
		}
		files[key] = f
	}
	return files, nil
}

// compileBindings checks every key and turns the hosts into routes. A host bound by several
// keys (GEMINI_API_KEY and GOOGLE_API_KEY) is one route, so they must agree on its error shape
// and upstream.
func compileBindings(files map[string]bindingFile) (bindings, error) {
	if len(files) == 0 {
		return bindings{}, errors.New("no brokered key: name at least one")
	}
	names := make([]string, 0, len(files))
	for k := range files {
		names = append(names, k)
	}
	sort.Strings(names)
	out := bindings{keys: map[string]broker.Binding{}}
	routes := map[string]proxy.Route{}
	owner := map[string]string{}
	for _, key := range names {
		f := files[key]
		format, ok := errorFormats[f.Errors]
		if !ok {
			return bindings{}, fmt.Errorf("%s.errors: %q is not one of anthropic, openai, google", key, f.Errors)
		}
		b := broker.Binding{Hosts: f.Hosts}
		for _, h := range f.Headers {
			b.Headers = append(b.Headers, broker.Header(strings.ToLower(h)))
		}
		// broker.MintRequest.Validate is the one check of a binding: the key's name, its hosts
		// and headers (a stand-in value and ids; only binding and key errors can come back).
		probe := broker.MintRequest{Company: "c", Run: "r", Lease: "l", Key: key, Binding: b, Value: "v"}
		if err := probe.Validate(); err != nil {
			var fe *broker.FieldError
			if errors.As(err, &fe) && fe.Field == "key" {
				return bindings{}, fmt.Errorf("%q: %s", key, fe.Reason)
			}
			if errors.As(err, &fe) {
				return bindings{}, fmt.Errorf("%s.%s: %s", key, strings.TrimPrefix(fe.Field, "binding."), fe.Reason)
			}
			return bindings{}, fmt.Errorf("%s: %w", key, err)
		}
		for i, h := range f.Hosts {
			host, _ := ca.CanonicalHost(h) // checked above
			r := proxy.Route{Host: host, Errors: format}
			for uh, addr := range f.Upstreams {
				if c, err := ca.CanonicalHost(uh); err == nil && c == host {
					r.Address = addr
				}
			}
			if prev, ok := routes[host]; ok {
				if prev != r {
					return bindings{}, fmt.Errorf("%s.hosts[%d]: %s is bound by %s too, with another error shape or upstream: a host has one", key, i, host, owner[host])
				}
				continue
			}
			routes[host], owner[host] = r, key
		}
		for uh, addr := range f.Upstreams {
			c, err := ca.CanonicalHost(uh)
			if err != nil || !slices.ContainsFunc(f.Hosts, func(h string) bool { hc, _ := ca.CanonicalHost(h); return hc == c }) {
				return bindings{}, fmt.Errorf("%s.upstreams: %q is not one of the key's hosts", key, uh)
			}
			if _, _, err := net.SplitHostPort(addr); err != nil {
				return bindings{}, fmt.Errorf("%s.upstreams.%s: %q is not host:port", key, uh, addr)
			}
		}
		out.keys[key] = b
	}
	for _, h := range slices.Sorted(maps.Keys(routes)) {
		out.routes = append(out.routes, routes[h])
	}
	return out, nil
}
