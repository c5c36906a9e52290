package broker

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/ecdh"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
)

// SealingKeyLen is the sealing key's length: AES-256.
const SealingKeyLen = 32

// Sealer seals grants' real values with AES-256-GCM under the broker's sealing key, the grant
// id as additional data: NATS (its store, its backups, anyone who reads the bucket) holds only
// ciphertext, and a sealed value copied into another grant does not open there.
type Sealer struct {
	aead cipher.AEAD
	// idKey keys grantID: derived from the sealing key, so ids are stable across replicas and
	// restarts and cannot be computed by whoever knows only a company's and lease's ids.
	idKey []byte
	// mintKey is the X25519 key mint requests seal their values to (MintKey).
	mintKey *ecdh.PrivateKey
}

// mintKeyInfo is HKDF's info for the mint key: the sealing key's other uses never derive it.
const mintKeyInfo = "kubeclip credential broker mint key v1"

// NewSealer uses key, exactly SealingKeyLen bytes.
func NewSealer(key []byte) (*Sealer, error) {
	if len(key) != SealingKeyLen {
		return nil, fmt.Errorf("the broker's sealing key must be %d bytes, got %d", SealingKeyLen, len(key))
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("the broker's sealing key: %w", err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("the broker's sealing key: %w", err)
	}
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte("kubeclip credential broker grant ids v1"))
	seed, err := hkdf.Key(sha256.New, key, nil, mintKeyInfo, 32)
	if err != nil {
		return nil, fmt.Errorf("deriving the broker's mint key: %w", err)
	}
	mintKey, err := ecdh.X25519().NewPrivateKey(seed)
	clear(seed)
	if err != nil {
		return nil, fmt.Errorf("deriving the broker's mint key: %w", err)
	}
	return &Sealer{aead: aead, idKey: mac.Sum(nil), mintKey: mintKey}, nil
}

// MintKey is the X25519 private key requesters seal mint values to (pkg/broker/mintproto):
// HKDF-SHA256 of the sealing key, info mintKeyInfo. Derived rather than a second operator file
// because every replica must hold the same key (a requester asks one replica for the public key
// and its mint may reach another), which the sealing key already is, and because whoever holds
// the sealing key can open every grant anyway: a separate file would add a secret to deploy and
// rotate without protecting anything more. HKDF's one-wayness keeps the two uses apart: the
// mint key reveals nothing of the sealing key.
func (s *Sealer) MintKey() *ecdh.PrivateKey { return s.mintKey }

// grantID is the id of the one grant a lease holds for a key: an HMAC of the company, the lease
// and the key's name under a key derived from the sealing key. Mint is idempotent because of
// it: a mint repeated (a redelivery, a retry after a lost answer) finds the grant the first one
// made instead of making a second.
func (s *Sealer) grantID(company, lease, key string) GrantID {
	mac := hmac.New(sha256.New, s.idKey)
	for _, part := range []string{company, lease, key} {
		var n [4]byte
		binary.BigEndian.PutUint32(n[:], uint32(len(part)))
		mac.Write(n[:])
		mac.Write([]byte(part))
	}
	var id GrantID
	copy(id[:], mac.Sum(nil))
	return id
}

// LoadSealingKey reads the sealing key from path: exactly SealingKeyLen raw bytes, as a
// Kubernetes Secret's key mounts them (`head -c 32 /dev/urandom`). No trimming: a key file of
// 33 bytes is a mistake to report, not a newline to guess away. Errors name the path and the
// length, never the content.
func LoadSealingKey(path string) (*Sealer, error) {
	key, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the broker's sealing key: %w", err)
	}
	s, err := NewSealer(key)
	clear(key)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

// seal encrypts value for grant id: a fresh random nonce, then the ciphertext and tag. Random
// 96-bit nonces stay safe for some 2^32 seals under one key, far beyond the grants a broker
// mints between key rotations.
func (s *Sealer) seal(id GrantID, value []byte) ([]byte, error) { return s.sealAAD(id[:], value) }

// sealSecret encrypts a placeholder's secret part for grant id, under additional data other
// than the value's, so the one sealed text cannot stand in for the other.
func (s *Sealer) sealSecret(id GrantID, secret []byte) ([]byte, error) {
	return s.sealAAD(secretAAD(id), secret)
}

func secretAAD(id GrantID) []byte { return append(id[:], "/secret"...) }

func (s *Sealer) sealAAD(aad, value []byte) ([]byte, error) {
	nonce := make([]byte, s.aead.NonceSize(), s.aead.NonceSize()+len(value)+s.aead.Overhead())
	if _, err := rand.Read(nonce); err != nil {
		return nil, fmt.Errorf("drawing a nonce: %w", err)
	}
	return s.aead.Seal(nonce, nonce, value, aad), nil
}

// errUnsealable is open's only error: the value was sealed under another key or for another
// grant, or altered.
var errUnsealable = errors.New("the grant's value does not open under this broker's sealing key")

// open decrypts what seal made for grant id.
func (s *Sealer) open(id GrantID, sealed []byte) ([]byte, error) { return s.openAAD(id[:], sealed) }

// openSecret decrypts what sealSecret made for grant id.
func (s *Sealer) openSecret(id GrantID, sealed []byte) ([]byte, error) {
	return s.openAAD(secretAAD(id), sealed)
}

func (s *Sealer) openAAD(aad, sealed []byte) ([]byte, error) {
	n := s.aead.NonceSize()
	if len(sealed) < n+s.aead.Overhead() {
		return nil, errUnsealable
	}
	value, err := s.aead.Open(nil, sealed[:n], sealed[n:], aad)
	if err != nil {
		return nil, errUnsealable
	}
	return value, nil
}
