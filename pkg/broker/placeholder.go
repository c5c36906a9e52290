package broker

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"strings"
)

// PlaceholderPrefix starts every placeholder, so a placeholder is recognizable wherever it
// turns up (a header, a log a secret scanner reads) and never mistaken for a real key.
const PlaceholderPrefix = "kcph_"

const (
	idLen     = 16
	secretLen = 32
	// idText and secretText are the base64url (unpadded) lengths of the id and the secret.
	idText     = 22
	secretText = 43
	// PlaceholderLen is a placeholder's length: prefix, id, '_', secret.
	PlaceholderLen = len(PlaceholderPrefix) + idText + 1 + secretText
)

// GrantID names a grant: random, the first part of its placeholder, and the last token of its
// key in the bucket (hex). It is not secret; the placeholder's secret part is.
type GrantID [idLen]byte

// String is the id in hex, as the bucket's key holds it.
func (id GrantID) String() string { return hex.EncodeToString(id[:]) }

// parseGrantID inverts GrantID.String.
func parseGrantID(s string) (GrantID, bool) {
	var id GrantID
	if len(s) != 2*idLen {
		return id, false
	}
	_, err := hex.Decode(id[:], []byte(s))
	return id, err == nil
}

// Placeholder is what a pod gets instead of a key's value: "kcph_" + base64url(grant id) + "_"
// + base64url(32 random bytes). The id finds the grant; the store keeps only the SHA-256 of the
// random part, so the placeholder is useless without the store and the store is useless
// without the placeholder. String redacts the secret part, so a placeholder formatted into a
// log or an error by mistake gives nothing away; Reveal is the whole text, for the pod's
// environment only.
type Placeholder struct {
	id     GrantID
	secret [secretLen]byte
}

// newPlaceholder draws a fresh secret for grant id.
func newPlaceholder(id GrantID) (Placeholder, error) {
	p := Placeholder{id: id}
	if _, err := rand.Read(p.secret[:]); err != nil {
		return p, fmt.Errorf("drawing a placeholder secret: %w", err)
	}
	return p, nil
}

// ID is the grant the placeholder names.
func (p Placeholder) ID() GrantID { return p.id }

// Reveal is the placeholder's whole text, the value the pod's environment carries.
func (p Placeholder) Reveal() string {
	return PlaceholderPrefix + base64.RawURLEncoding.EncodeToString(p.id[:]) + "_" + base64.RawURLEncoding.EncodeToString(p.secret[:])
}

// String is the placeholder with its secret part redacted.
func (p Placeholder) String() string {
	return PlaceholderPrefix + base64.RawURLEncoding.EncodeToString(p.id[:]) + "_[redacted]"
}

// secretHash is what the store keeps of the secret part.
func (p Placeholder) secretHash() [sha256.Size]byte { return sha256.Sum256(p.secret[:]) }

// LooksLikePlaceholder reports whether s starts as a placeholder does: the proxy's test for a
// header value it must resolve (a malformed one is refused, not forwarded).
func LooksLikePlaceholder(s string) bool { return strings.HasPrefix(s, PlaceholderPrefix) }

// ParsePlaceholder reads a placeholder's text. Its id and secret are fixed-length base64url,
// which may themselves contain '_', so it is split by position, not by separator. The error
// (a *RefusedError, ReasonMalformed) never quotes s.
func ParsePlaceholder(s string) (Placeholder, error) {
	var p Placeholder
	if len(s) != PlaceholderLen || !LooksLikePlaceholder(s) || s[len(PlaceholderPrefix)+idText] != '_' {
		return p, refuse(ReasonMalformed)
	}
	idPart := s[len(PlaceholderPrefix) : len(PlaceholderPrefix)+idText]
	secretPart := s[len(PlaceholderPrefix)+idText+1:]
	n1, err1 := base64.RawURLEncoding.Strict().Decode(p.id[:], []byte(idPart))
	n2, err2 := base64.RawURLEncoding.Strict().Decode(p.secret[:], []byte(secretPart))
	if err1 != nil || err2 != nil || n1 != idLen || n2 != secretLen {
		return Placeholder{}, refuse(ReasonMalformed)
	}
	return p, nil
}
