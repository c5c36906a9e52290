package mintproto

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/ecdh"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
)

// Sealing a value to the broker (issue 27: the real value never crosses NATS in clear). NATS
// permissions keep every user but the broker's from subscribing to mint subjects, but the
// server itself, its traces and anyone who reads its traffic (a capture, a monitoring tap)
// would still see a value sent as JSON. So the requester seals it to the broker's X25519 key
// (ECIES): a fresh ephemeral key pair per mint, X25519 with the broker's public key,
// HKDF-SHA256 of the shared secret (salt: both public keys, info: SealInfo) to an AES-256-GCM
// key, and the grant's ids as additional data, so a sealed value copied into a request for
// another company, run, lease or key does not open. The request carries the ephemeral public
// key, the nonce and the ciphertext; only the broker's private key opens them.
//
// plugins/paperclip/src/broker.ts implements the same construction; TestSealVector pins
// the bytes both produce.

// SealInfo is HKDF's info: the construction's name and version.
const SealInfo = "kubeclip credential broker mint v1"

// KeyLen is an X25519 public key's length.
const KeyLen = 32

// NonceLen is the AES-GCM nonce's length.
const NonceLen = 12

// aadLabel starts the additional data, so it cannot be mistaken for another construction's.
const aadLabel = "kubeclip mint v1"

// AAD is the additional data of a value sealed for one grant: aadLabel, then company, run,
// lease and key, each as a 4-byte big-endian length and its bytes (no two tuples encode alike).
func AAD(company, run, lease, key string) []byte {
	b := []byte(aadLabel)
	for _, part := range []string{company, run, lease, key} {
		b = binary.BigEndian.AppendUint32(b, uint32(len(part)))
		b = append(b, part...)
	}
	return b
}

// Sealed is a value sealed to the broker: the three fields a MintRequest carries, base64
// (standard, padded) as on the wire.
type Sealed struct {
	EphemeralKey string
	Nonce        string
	Ciphertext   string
}

// Seal seals value to the broker's public key for the grant aad names (AAD).
func Seal(broker *ecdh.PublicKey, aad, value []byte) (Sealed, error) {
	if broker == nil || broker.Curve() != ecdh.X25519() {
		return Sealed{}, errors.New("sealing a mint value: the broker's key must be an X25519 public key")
	}
	eph, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		return Sealed{}, fmt.Errorf("sealing a mint value: %w", err)
	}
	shared, err := eph.ECDH(broker)
	if err != nil {
		return Sealed{}, fmt.Errorf("sealing a mint value: %w", err)
	}
	aead, err := sealingAEAD(shared, eph.PublicKey().Bytes(), broker.Bytes())
	if err != nil {
		return Sealed{}, fmt.Errorf("sealing a mint value: %w", err)
	}
	nonce := make([]byte, NonceLen)
	if _, err := rand.Read(nonce); err != nil {
		return Sealed{}, fmt.Errorf("sealing a mint value: %w", err)
	}
	enc := base64.StdEncoding
	return Sealed{
		EphemeralKey: enc.EncodeToString(eph.PublicKey().Bytes()),
		Nonce:        enc.EncodeToString(nonce),
		Ciphertext:   enc.EncodeToString(aead.Seal(nil, nonce, value, aad)),
	}, nil
}

// sealingAEAD is the AES-256-GCM of one seal: HKDF-SHA256 of the X25519 shared secret, salted
// with the ephemeral public key then the broker's (binding the key to both), info SealInfo.
// shared is cleared.
func sealingAEAD(shared, ephemeral, broker []byte) (cipher.AEAD, error) {
	salt := append(append(make([]byte, 0, 2*KeyLen), ephemeral...), broker...)
	key, err := hkdf.Key(sha256.New, shared, salt, SealInfo, 32)
	clear(shared)
	if err != nil {
		return nil, err
	}
	block, err := aes.NewCipher(key)
	clear(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

// ErrUnsealable is Opener.Open's refusal of a value that does not open: sealed to another
// broker key, for another grant, or altered.
var ErrUnsealable = errors.New("the value does not open under the broker's key (sealed to another key, for another company, run, lease or key, or altered)")

// Opener opens values sealed to the broker's private key.
type Opener struct{ key *ecdh.PrivateKey }

// NewOpener uses the broker's X25519 private key (broker.Sealer.MintKey).
func NewOpener(key *ecdh.PrivateKey) (*Opener, error) {
	if key == nil || key.Curve() != ecdh.X25519() {
		return nil, errors.New("mintproto: the broker's mint key must be an X25519 private key")
	}
	return &Opener{key: key}, nil
}

// PublicKey is the key requesters seal to.
func (o *Opener) PublicKey() *ecdh.PublicKey { return o.key.PublicKey() }

// Open decrypts r's sealed value for the grant aad names. r must be Validated (its fields are
// well-formed base64 of the right lengths). The error is an *Error naming the field, never a
// value.
func (o *Opener) Open(r MintRequest, aad []byte) ([]byte, error) {
	s, err := r.sealed()
	if err != nil {
		return nil, err
	}
	eph, err := ecdh.X25519().NewPublicKey(s.ephemeral)
	if err != nil {
		return nil, Invalid("ephemeralKey", "must be an X25519 public key")
	}
	shared, err := o.key.ECDH(eph)
	if err != nil {
		// A low-order point gives an all-zero secret, which crypto/ecdh refuses.
		return nil, Invalid("ephemeralKey", "must be an X25519 public key of full order")
	}
	aead, err := sealingAEAD(shared, s.ephemeral, o.key.PublicKey().Bytes())
	if err != nil {
		return nil, Invalid("ciphertext", "%v", ErrUnsealable)
	}
	value, err := aead.Open(nil, s.nonce, s.ciphertext, aad)
	if err != nil {
		return nil, Invalid("ciphertext", "%v", ErrUnsealable)
	}
	return value, nil
}

// sealedBytes are a request's sealed fields decoded.
type sealedBytes struct{ ephemeral, nonce, ciphertext []byte }

// sealed decodes r's sealed fields; errors name the field.
func (r MintRequest) sealed() (sealedBytes, error) {
	var s sealedBytes
	var err error
	enc := base64.StdEncoding
	if s.ephemeral, err = enc.DecodeString(r.EphemeralKey); err != nil || len(s.ephemeral) != KeyLen {
		return s, Invalid("ephemeralKey", "must be the base64 of a %d-byte X25519 public key", KeyLen)
	}
	if s.nonce, err = enc.DecodeString(r.Nonce); err != nil || len(s.nonce) != NonceLen {
		return s, Invalid("nonce", "must be the base64 of %d bytes", NonceLen)
	}
	// At least the GCM tag; a value's own bound is broker.MintRequest's (checked once opened).
	if s.ciphertext, err = enc.DecodeString(r.Ciphertext); err != nil || len(s.ciphertext) <= 16 {
		return s, Invalid("ciphertext", "must be the base64 of a sealed, non-empty value")
	}
	return s, nil
}
