package mintproto_test

import (
	"bytes"
	"crypto/ecdh"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"testing"

	"github.com/kubeclip/kubeclip/pkg/broker/mintproto"
)

const sealedSecret = "sk-ant-api03-SEALED-VALUE-0123456789"

func request(t *testing.T, pub *ecdh.PublicKey, aad []byte, lease, key, value string) mintproto.MintRequest {
	t.Helper()
	s, err := mintproto.Seal(pub, aad, []byte(value))
	if err != nil {
		t.Fatal(err)
	}
	return mintproto.MintRequest{LeaseID: lease, Key: key, EphemeralKey: s.EphemeralKey, Nonce: s.Nonce, Ciphertext: s.Ciphertext}
}

// TestSealOpens: a sealed value opens under the broker's key for exactly the grant it was
// sealed for, and its wire bytes hold neither the value nor its base64.
func TestSealOpens(t *testing.T) {
	key, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	o, err := mintproto.NewOpener(key)
	if err != nil {
		t.Fatal(err)
	}
	aad := mintproto.AAD("company-a", "run-1", "lease-1", "ANTHROPIC_API_KEY")
	r := request(t, o.PublicKey(), aad, "lease-1", "ANTHROPIC_API_KEY", sealedSecret)
	if err := r.Validate(); err != nil {
		t.Fatalf("a sealed request does not validate: %v", err)
	}
	got, err := o.Open(r, aad)
	if err != nil || string(got) != sealedSecret {
		t.Fatalf("Open: %v (the value came back: %v)", err, string(got) == sealedSecret)
	}
	wire, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	for _, leak := range [][]byte{[]byte(sealedSecret), []byte(base64.StdEncoding.EncodeToString([]byte(sealedSecret))), []byte("SEALED-VALUE")} {
		if bytes.Contains(wire, leak) {
			t.Errorf("the request's wire bytes hold the value (%d bytes of it)", len(leak))
		}
	}
	t.Logf("wire_bytes\tvalue_bytes\n%d\t%d", len(wire), len(sealedSecret))

	// Another seal of the same value differs (fresh ephemeral key and nonce).
	if again := request(t, o.PublicKey(), aad, "lease-1", "ANTHROPIC_API_KEY", sealedSecret); again.Ciphertext == r.Ciphertext || again.EphemeralKey == r.EphemeralKey {
		t.Error("two seals of one value are alike")
	}
	for name, other := range map[string][]byte{
		"company": mintproto.AAD("company-b", "run-1", "lease-1", "ANTHROPIC_API_KEY"),
		"run":     mintproto.AAD("company-a", "run-2", "lease-1", "ANTHROPIC_API_KEY"),
		"lease":   mintproto.AAD("company-a", "run-1", "lease-2", "ANTHROPIC_API_KEY"),
		"key":     mintproto.AAD("company-a", "run-1", "lease-1", "OPENAI_API_KEY"),
		// The lengths keep a shifted boundary from encoding alike.
		"boundary": mintproto.AAD("company-ar", "un-1", "lease-1", "ANTHROPIC_API_KEY"),
	} {
		var e *mintproto.Error
		if _, err := o.Open(r, other); !errors.As(err, &e) || e.Field != "ciphertext" {
			t.Errorf("a value sealed for another %s opened: %v", name, err)
		}
	}
	tampered := r
	ct, _ := base64.StdEncoding.DecodeString(r.Ciphertext)
	ct[0] ^= 1
	tampered.Ciphertext = base64.StdEncoding.EncodeToString(ct)
	if _, err := o.Open(tampered, aad); err == nil {
		t.Error("an altered ciphertext opened")
	}
	// A low-order point as the ephemeral key (all zeros) is refused, naming the field.
	zero := r
	zero.EphemeralKey = base64.StdEncoding.EncodeToString(make([]byte, mintproto.KeyLen))
	var e *mintproto.Error
	if _, err := o.Open(zero, aad); !errors.As(err, &e) || e.Field != "ephemeralKey" {
		t.Errorf("an all-zero ephemeral key: %v, want a refusal naming ephemeralKey", err)
	}
}

// pluginVector is a value sealed by the plugin's sealValue (plugins/paperclip/src/broker.ts,
// broker.test.ts "the seal opens in Go") to the X25519 key whose private scalar is
// pluginBrokerKey, for company-a, run-1, lease-1, ANTHROPIC_API_KEY: the two implementations
// agree byte for byte on the construction.
var pluginVector = struct{ key, ephemeralKey, nonce, ciphertext string }{
	key:          "oKCgoKCgoKCgoKCgoKCgoFtbW1tbW1tbW1tbW1tbW1s=",
	ephemeralKey: "1CkY2ltKyzXbE+34W9WkckNz+92QT4wk6Tk96DKCrmE=",
	nonce:        "AAECAwQFBgcICQoL",
	ciphertext:   "vMaIK4DAjGQxGCiert0QZjFs3i6/TbKHi5VKFUdrbFScZ6iqR7mELIJEEniT4USuQ11qMQ==",
}

// TestOpensThePluginsSeal: a value the TypeScript side sealed opens here.
func TestOpensThePluginsSeal(t *testing.T) {
	raw, err := base64.StdEncoding.DecodeString(pluginVector.key)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdh.X25519().NewPrivateKey(raw)
	if err != nil {
		t.Fatal(err)
	}
	o, err := mintproto.NewOpener(key)
	if err != nil {
		t.Fatal(err)
	}
	r := mintproto.MintRequest{LeaseID: "lease-1", Key: "ANTHROPIC_API_KEY", EphemeralKey: pluginVector.ephemeralKey, Nonce: pluginVector.nonce, Ciphertext: pluginVector.ciphertext}
	got, err := o.Open(r, mintproto.AAD("company-a", "run-1", "lease-1", "ANTHROPIC_API_KEY"))
	if err != nil || string(got) != sealedSecret {
		t.Fatalf("the plugin's seal: %v (opened to the value: %v)", err, string(got) == sealedSecret)
	}
}
