package execsvc

import (
	"fmt"
	"slices"
	"strings"

	"github.com/kubeclip/kubeclip/pkg/broker"
	"github.com/kubeclip/kubeclip/pkg/execproto"
)

// BrokeredKeys are the environment keys the credential broker holds for the installation
// (issue 27): a start must carry each one's placeholder, never its real value. The plugin
// replaces brokered values before it publishes (plugins/paperclip/src/broker.ts); this is the
// defence in depth for every other client, so a real key that reached the exec subject by any
// route goes no further than the exec-worker and never into a pod.
//
// The zero BrokeredKeys brokers nothing (installations without a broker).
type BrokeredKeys struct{ keys []string }

// NewBrokeredKeys validates the operator's list: each a non-empty key name without = or NUL,
// none twice.
func NewBrokeredKeys(keys []string) (BrokeredKeys, error) {
	var b BrokeredKeys
	for _, k := range keys {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return BrokeredKeys{}, fmt.Errorf("brokered key %q must be a non-empty environment key without = or NUL", k)
		}
		if slices.Contains(b.keys, k) {
			return BrokeredKeys{}, fmt.Errorf("brokered key %q is named twice", k)
		}
		b.keys = append(b.keys, k)
	}
	return b, nil
}

// Check refuses env when a brokered key holds anything but a well-formed placeholder, with an
// invalid_request naming the key (field env.<KEY>) and never quoting the value. An empty value
// passes: it holds no secret. Keys are matched exactly, case-sensitively, as the environment is.
func (b BrokeredKeys) Check(env map[string]string) error {
	for _, k := range b.keys {
		v, ok := env[k]
		if !ok || v == "" {
			continue
		}
		if _, err := broker.ParsePlaceholder(v); err != nil {
			return execproto.InvalidRequest("env."+k, "%s is brokered: its value must be a placeholder minted by the credential broker, not a real value (the exec was refused before anything ran)", k)
		}
	}
	return nil
}
