package events

import (
	"encoding/base64"
	"strings"
)

// RunRef names a run: a run id means something only within its company. Paperclip mints run
// ids, and nothing stops one company from sending another company's run id, so every record,
// key, message id and index that identifies a run is built from a RunRef, never from the run
// id alone.
type RunRef struct {
	CompanyID string
	RunID     string
}

// Ref returns the run the ids name.
func Ref(companyID, runID string) RunRef { return RunRef{CompanyID: companyID, RunID: runID} }

// Validate checks that both ids are subject tokens (a TerminalError naming the field).
func (r RunRef) Validate() error { return validateIDs(r.CompanyID, r.RunID) }

// MsgID is the JetStream message id of the run's event or request named by suffix:
// "<companyId>.<runId>.<suffix>". Ids are subject tokens, which never contain '.', so distinct
// runs never share an id, whichever company sent them.
func (r RunRef) MsgID(suffix string) string { return r.CompanyID + "." + r.RunID + "." + suffix }

// keyEncoded prefixes an id that is not a valid KV key token as it is.
const keyEncoded = "_b64_"

// Key is the run's key in kubeclip's KV buckets: "<company>.<run>", each part the id itself when
// it is made of KV key characters (UUIDs are), else "_b64_" + its base64url form. Ids never
// contain '.', nor does base64url, so the key splits back into exactly the two ids.
func (r RunRef) Key() string { return keyPart(r.CompanyID) + "." + keyPart(r.RunID) }

// ParseRunKey inverts RunRef.Key; ok is false for a key of another shape.
func ParseRunKey(key string) (RunRef, bool) {
	c, r, found := strings.Cut(key, ".")
	if !found || strings.Contains(r, ".") {
		return RunRef{}, false
	}
	company, ok1 := parseKeyPart(c)
	run, ok2 := parseKeyPart(r)
	if !ok1 || !ok2 {
		return RunRef{}, false
	}
	return RunRef{CompanyID: company, RunID: run}, true
}

func keyPart(id string) string {
	if isKVKey(id) && !strings.Contains(id, ".") && !strings.HasPrefix(id, keyEncoded) {
		return id
	}
	return keyEncoded + base64.RawURLEncoding.EncodeToString([]byte(id))
}

func parseKeyPart(part string) (string, bool) {
	rest, encoded := strings.CutPrefix(part, keyEncoded)
	if !encoded {
		return part, part != ""
	}
	b, err := base64.RawURLEncoding.DecodeString(rest)
	return string(b), err == nil && len(b) > 0
}

// isKVKey mirrors the KV key rule: [-/_=.a-zA-Z0-9]+, not starting or ending with '.'.
func isKVKey(k string) bool {
	if k == "" || k[0] == '.' || k[len(k)-1] == '.' {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '/' || c == '_' || c == '=' || c == '.') {
			return false
		}
	}
	return true
}
