package broker

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
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
}

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
	return &Sealer{aead: aead}, nil
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
func (s *Sealer) seal(id GrantID, value []byte) ([]byte, error) {
	nonce := make([]byte, s.aead.NonceSize(), s.aead.NonceSize()+len(value)+s.aead.Overhead())
	if _, err := rand.Read(nonce); err != nil {
		return nil, fmt.Errorf("drawing a nonce: %w", err)
	}
	return s.aead.Seal(nonce, nonce, value, id[:]), nil
}

// errUnsealable is open's only error: the value was sealed under another key or for another
// grant, or altered.
var errUnsealable = errors.New("the grant's value does not open under this broker's sealing key")

// open decrypts what seal made for grant id.
func (s *Sealer) open(id GrantID, sealed []byte) ([]byte, error) {
	n := s.aead.NonceSize()
	if len(sealed) < n+s.aead.Overhead() {
		return nil, errUnsealable
	}
	value, err := s.aead.Open(nil, sealed[:n], sealed[n:], id[:])
	if err != nil {
		return nil, errUnsealable
	}
	return value, nil
}
