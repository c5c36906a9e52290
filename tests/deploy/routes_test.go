package deploy_test

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubeclip/kubeclip/internal/natstest"
)

// TestSecretsScriptMakesRouteTLS runs hack/deploy/secrets.sh in a namespace of its own: besides
// the users' passwords and the sandbox key, it makes kubeclip-nats-routes, the production
// overlay's route CA (ca.crt) and the one certificate and key the servers share (tls.crt,
// tls.key), no CA key. The certificate is the route user's (natstest.RouteName, the subject
// nats.conf maps), chains to ca.crt for every StatefulSet server's name as a server and as a
// client (a route is both). A second run keeps it.
func TestSecretsScriptMakesRouteTLS(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	ns := "kubeclip-secrets-" + shortID()
	if _, err := c.cs.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.deleteAtEnd(t, ns, nil)
	installSecrets(t, c, ns)
	routes := func() map[string][]byte {
		s, err := c.cs.CoreV1().Secrets(ns).Get(t.Context(), "kubeclip-nats-routes", metav1.GetOptions{})
		if err != nil {
			t.Fatalf("reading the route Secret: %v", err)
		}
		return s.Data
	}
	data := routes()
	var keys []string
	for k := range data {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	if want := []string{"ca.crt", "tls.crt", "tls.key"}; !slices.Equal(keys, want) {
		t.Fatalf("kubeclip-nats-routes has keys %v, want %v", keys, want)
	}
	pair, err := tls.X509KeyPair(data["tls.crt"], data["tls.key"])
	if err != nil {
		t.Fatalf("tls.crt and tls.key: %v", err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	if got, want := leaf.Subject.String(), "CN="+natstest.RouteName; got != want {
		t.Errorf("route certificate subject %q, want %q (nats.conf's cluster authorization user)", got, want)
	}
	cas := x509.NewCertPool()
	if !cas.AppendCertsFromPEM(data["ca.crt"]) {
		t.Fatal("ca.crt holds no certificate")
	}
	if block, _ := pem.Decode(data["ca.crt"]); block == nil || block.Type != "CERTIFICATE" || len(bytes.TrimSpace(data["ca.crt"])) != len(bytes.TrimSpace(pem.EncodeToMemory(block))) {
		t.Error("ca.crt holds more than the CA's certificate")
	}
	for _, host := range []string{"nats-0.nats-headless", "nats-2.nats-headless", "nats-1.nats-headless." + ns + ".svc"} {
		for _, usage := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
			if _, err := leaf.Verify(x509.VerifyOptions{DNSName: host, Roots: cas, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
				t.Errorf("route certificate for %s (usage %v): %v", host, usage, err)
			}
		}
	}

	installSecrets(t, c, ns)
	if again := routes(); !bytes.Equal(again["ca.crt"], data["ca.crt"]) || !bytes.Equal(again["tls.key"], data["tls.key"]) {
		t.Error("a second secrets.sh replaced the route CA or key")
	}
}
