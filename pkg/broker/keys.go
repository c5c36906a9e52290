package broker

import (
	"fmt"
	"slices"
	"strings"
)

// KeyNames reads an operator's list of brokered keys (the exec-worker's and the dispatcher's
// --brokered-keys, given as one comma-separated value, many values, or both): each a non-empty
// environment key without = or NUL, none twice. One reader, so both workers broker exactly the
// same keys from the same setting.
func KeyNames(values []string) ([]string, error) {
	var keys []string
	for _, v := range values {
		for _, k := range strings.Split(v, ",") {
			if k = strings.TrimSpace(k); k == "" {
				continue
			}
			if err := checkKeyName(k); err != nil {
				return nil, err
			}
			if slices.Contains(keys, k) {
				return nil, fmt.Errorf("brokered key %q is named twice", k)
			}
			keys = append(keys, k)
		}
	}
	return keys, nil
}

// checkKeyName refuses a name no environment key can have.
func checkKeyName(k string) error {
	if k == "" || strings.ContainsAny(k, "=\x00") {
		return fmt.Errorf("brokered key %q must be a non-empty environment key without = or NUL", k)
	}
	return nil
}
