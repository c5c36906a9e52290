package sandboxd

import (
	"bytes"
	"context"
	"crypto/subtle"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"

	"github.com/kubeclip/kubeclip/pkg/execspec"
)

// A warm pod's daemon starts unbound (Options.Unbound): its TCP listener is keyed by the pod's
// bind seed (execspec.DeriveBindSeed) and answers only POST /v1/bind, which installs a lease's
// seed and environment. From then on the daemon is the lease's, exactly as one started with its
// seed, and the bind seed opens nothing.

// bindPath is the one route an unbound daemon answers, to POST only.
const bindPath = "/v1/bind"

// maxBindBytes bounds a bind's body: its env goes to execve with every command, as a spec's does.
const maxBindBytes = maxSpecBytes

// identity is who the daemon is to its clients: the TCP listener's certificate and bearer token,
// and the environment commands start from. An unbound daemon's identity is the bind seed's and
// runs nothing; a bind replaces it, once, with the lease's.
type identity struct {
	bound bool
	cert  *tls.Certificate // nil without a TCP listener
	auth  []byte           // "Bearer " + ClientToken(seed); nil without a TCP listener
	env   []string
}

// newIdentity derives an identity from seed; tcp says whether there is a TCP listener to key.
func newIdentity(seed []byte, tcp, bound bool, env []string) (*identity, error) {
	id := &identity{bound: bound, env: env}
	if !tcp {
		return id, nil
	}
	cert, err := serverCertificate(seed)
	if err != nil {
		return nil, err
	}
	id.cert, id.auth = cert, []byte("Bearer "+ClientToken(seed))
	return id, nil
}

// bindRequest is POST /v1/bind's body.
type bindRequest struct {
	// Seed is hex(lease seed), execspec.SeedSize bytes.
	Seed string `json:"seed"`
	// Env is laid over the daemon's environment for every command of the lease.
	Env map[string]string `json:"env,omitempty"`
}

// parse checks the request and returns its seed. Messages name fields, never the seed or a value.
func (b bindRequest) parse() ([]byte, error) {
	var errs []error
	bad := func(field, msg string) { errs = append(errs, &fieldError{Field: field, Msg: msg}) }
	seed, err := hex.DecodeString(b.Seed)
	if err != nil || len(seed) != execspec.SeedSize {
		bad("seed", fmt.Sprintf("must be the lease seed: %d bytes in hex", execspec.SeedSize))
	}
	checkEnv("env", b.Env, bad)
	if _, ok := b.Env[execspec.SeedEnv]; ok {
		bad("env", fmt.Sprintf("must not set %s", execspec.SeedEnv))
	}
	return seed, errors.Join(errs...)
}

// gate admits each request on one listener, deciding on one snapshot of the identity: on TCP
// the bearer token, then the state. Unbound, only a bind on TCP is served; bound, never a bind,
// and every route of the API (next).
func (s *Server) gate(tcp bool, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := s.id.Load()
		if tcp && subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), id.auth) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="sandboxd"`)
			writeError(w, CodeUnauthorized, "missing or wrong bearer token", nil)
			return
		}
		bind := r.Method == http.MethodPost && r.URL.Path == bindPath
		switch {
		case bind && id.bound:
			writeError(w, CodeAlreadyBound, "sandboxd is bound to a lease already", nil)
		case bind && !tcp:
			writeError(w, CodeNotBound, "sandboxd is not bound; the bind is served on its TLS listener only", nil)
		case bind:
			s.bind(w, r, id)
		case !id.bound:
			writeError(w, CodeNotBound, "sandboxd is not bound to a lease yet: it serves nothing until bound", nil)
		default:
			next.ServeHTTP(w, r)
		}
	})
}

// bind installs the lease's seed and environment in place of unbound, the identity the request
// was admitted under, unless another bind replaced it meanwhile. The answer is sent once the
// switch is in place: every handshake after it presents the lease's key, every request needs its
// token.
func (s *Server) bind(w http.ResponseWriter, r *http.Request, unbound *identity) {
	var req bindRequest
	if err := decodeStrict(r.Body, maxBindBytes, &req); err != nil {
		writeBodyError(w, err)
		return
	}
	seed, err := req.parse()
	if err != nil {
		writeError(w, CodeInvalidRequest, err.Error(), nil)
		return
	}
	defer clear(seed)
	if subtle.ConstantTimeCompare([]byte("Bearer "+ClientToken(seed)), unbound.auth) == 1 {
		writeError(w, CodeInvalidRequest, "seed: must be the lease seed, not the bind seed", nil)
		return
	}
	bound, err := newIdentity(seed, true, true, mergeEnv(s.opts.Env, req.Env))
	if err != nil {
		writeError(w, CodeInternal, err.Error(), nil)
		return
	}
	// One bind wins: the unbound identity is never restored, so every other bind admitted
	// under it finds it replaced.
	if !s.id.CompareAndSwap(unbound, bound) {
		writeError(w, CodeAlreadyBound, "sandboxd is bound to a lease already", nil)
		return
	}
	s.log.Info().Int(LogKeyEnvVars, len(req.Env)).Msg("bound")
	w.WriteHeader(http.StatusNoContent)
}

// ErrBoundElsewhere is Bind's answer from a daemon that is bound to another lease's seed (or a
// pod that is not the one whose bind seed was given: a reused address): this lease must take
// another pod.
var ErrBoundElsewhere = errors.New("sandboxd: the pod is bound to another lease")

// Bind binds the unbound daemon reached through dial to the lease with leaseSeed, laying env over
// its environment. It is idempotent: when the bind is refused because the daemon is bound
// already (its key is no longer the bind key, or it changed mid-way), Bind asks it, pinned to the
// lease's key and with the lease's token, whether it is this lease's, and returns nil if so (a
// retried bind whose answer was lost), ErrBoundElsewhere if its key is another's. Each attempt
// uses one connection, closed after it; ctx bounds the whole call. Errors never hold a seed or an
// env value.
func Bind(ctx context.Context, dial func(ctx context.Context) (net.Conn, error), bindSeed, leaseSeed []byte, env map[string]string) error {
	if len(bindSeed) != execspec.SeedSize || len(leaseSeed) != execspec.SeedSize {
		return fmt.Errorf("binding sandboxd: the bind and lease seeds must be %d bytes", execspec.SeedSize)
	}
	if bytes.Equal(bindSeed, leaseSeed) {
		return errors.New("binding sandboxd: the lease seed is the bind seed")
	}
	body, err := json.Marshal(bindRequest{Seed: hex.EncodeToString(leaseSeed), Env: env})
	if err != nil {
		return fmt.Errorf("binding sandboxd: encoding the request: %w", err)
	}
	err = oneShot(dial, bindSeed, func(c *Client) error {
		_, err := c.call(ctx, http.MethodPost, "/v1/bind", bytes.NewReader(body), "application/json", nil, http.StatusNoContent)
		return err
	})
	if err == nil {
		return nil
	}
	if !errors.Is(err, ErrServerKeyMismatch) && !errors.Is(err, ErrUnauthorized) && !errors.Is(err, ErrAlreadyBound) {
		return fmt.Errorf("binding sandboxd: %w", err)
	}
	perr := oneShot(dial, leaseSeed, func(c *Client) error {
		_, err := c.Info(ctx)
		return err
	})
	switch {
	case perr == nil:
		return nil
	case errors.Is(perr, ErrServerKeyMismatch):
		return fmt.Errorf("%w (the bind: %w)", ErrBoundElsewhere, err)
	default:
		return fmt.Errorf("binding sandboxd: %w; asking whether it is bound to this lease: %w", err, perr)
	}
}

// oneShot runs call with a client pinned to seed's key and carrying its token, over connections
// that are closed after each request.
func oneShot(dial func(ctx context.Context) (net.Conn, error), seed []byte, call func(*Client) error) error {
	c, err := NewClient(ClientOptions{Dial: dial, TLS: ClientTLSConfig(seed), Token: ClientToken(seed)})
	if err != nil {
		return err
	}
	c.tr.DisableKeepAlives = true
	defer c.Close()
	return call(c)
}
