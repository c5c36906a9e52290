package config

import (
	"bytes"
	"errors"
	"flag"
	"strings"
	"testing"
	"time"
)

type settings struct {
	URL     string
	Wait    time.Duration
	Workers int
	Debug   bool
	QPS     float64
}

func bind(s *Set, c *settings) {
	s.String(&c.URL, "nats-url", "T_NATS_URL", "nats://a:4222", "NATS URL")
	s.Duration(&c.Wait, "ack-wait", "T_ACK_WAIT", 30*time.Second, "ack wait")
	s.Int(&c.Workers, "workers", "T_WORKERS", 4, "workers")
	s.Bool(&c.Debug, "debug", "T_DEBUG", false, "debug")
	s.Float(&c.QPS, "qps", "T_QPS", 50, "qps")
}

func TestPrecedence(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		args []string
		want settings
	}{
		{name: "defaults", want: settings{URL: "nats://a:4222", Wait: 30 * time.Second, Workers: 4, QPS: 50}},
		{
			name: "env overrides defaults",
			env:  map[string]string{"T_NATS_URL": "nats://env:1", "T_ACK_WAIT": "5s", "T_WORKERS": "9", "T_DEBUG": "true", "T_QPS": "7.5"},
			want: settings{URL: "nats://env:1", Wait: 5 * time.Second, Workers: 9, Debug: true, QPS: 7.5},
		},
		{
			name: "flags override env",
			env:  map[string]string{"T_NATS_URL": "nats://env:1", "T_WORKERS": "9"},
			args: []string{"--nats-url", "nats://flag:2", "--workers=1"},
			want: settings{URL: "nats://flag:2", Wait: 30 * time.Second, Workers: 1, QPS: 50},
		},
		{
			name: "blank env is ignored",
			env:  map[string]string{"T_NATS_URL": "  "},
			want: settings{URL: "nats://a:4222", Wait: 30 * time.Second, Workers: 4, QPS: 50},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got settings
			s := New("x", func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok })
			bind(s, &got)
			if err := s.Parse(tc.args); err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestErrorsNameTheSetting(t *testing.T) {
	tests := []struct {
		name     string
		env      map[string]string
		args     []string
		wantText string
	}{
		{name: "bad env duration", env: map[string]string{"T_ACK_WAIT": "soon"}, wantText: "T_ACK_WAIT"},
		{name: "bad env int", env: map[string]string{"T_WORKERS": "many"}, wantText: "--workers"},
		{name: "bad env bool", env: map[string]string{"T_DEBUG": "perhaps"}, wantText: "T_DEBUG"},
		{name: "unknown flag", args: []string{"--nope"}, wantText: "nope"},
		{name: "stray argument", args: []string{"extra"}, wantText: `"extra"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got settings
			s := New("x", func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok })
			bind(s, &got)
			err := s.Parse(tc.args)
			if err == nil || !strings.Contains(err.Error(), tc.wantText) {
				t.Fatalf("Parse error = %v, want one containing %q", err, tc.wantText)
			}
		})
	}
}

func TestHelpListsEveryFlagWithEnvAndDefault(t *testing.T) {
	var got settings
	s := New("x", nil)
	bind(s, &got)
	if err := s.Parse([]string{"--help"}); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("Parse(--help) = %v, want flag.ErrHelp", err)
	}
	var buf bytes.Buffer
	s.Usage(&buf, "summary")
	for _, want := range []string{"--nats-url string", "env T_NATS_URL, default \"nats://a:4222\"", "--ack-wait duration", "default 30s", "env T_DEBUG, default false", "env T_QPS, default 50"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("usage lacks %q:\n%s", want, buf.String())
		}
	}
	if got := s.Names("ack-wait"); got != "--ack-wait (T_ACK_WAIT)" {
		t.Errorf("Names = %q", got)
	}
}

func TestStrings(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want []string
	}{
		{name: "none"},
		{name: "flag and alias, in order", args: []string{"--env", "A=1", "-e", "B=2,3"}, want: []string{"A=1", "B=2,3"}},
		{name: "env, one per line", env: map[string]string{"T_ENV": "A=1\nB=2\n"}, want: []string{"A=1", "B=2"}},
		{name: "flags replace env", env: map[string]string{"T_ENV": "A=1"}, args: []string{"-e", "C=3"}, want: []string{"C=3"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			s := New("x", func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok })
			s.Strings(&got, "env", "e", "T_ENV", "variables")
			if err := s.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			if strings.Join(got, "|") != strings.Join(tc.want, "|") {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// TestAlias: a one-letter alias sets the same setting, a boolean one without a value, and
// --help names it.
func TestAlias(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want bool
	}{
		{name: "neither", want: false},
		{name: "alias", args: []string{"-t"}, want: true},
		{name: "setting", args: []string{"--tty"}, want: true},
		{name: "alias false", args: []string{"-t=false"}, want: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got bool
			s := New("x", func(string) (string, bool) { return "", false })
			s.Bool(&got, "tty", "T_TTY", false, "a terminal")
			s.Alias("t", "tty")
			if err := s.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("got %v, want %v", got, tc.want)
			}
			var buf bytes.Buffer
			s.Usage(&buf, "summary")
			if !strings.Contains(buf.String(), "a terminal (also -t)") {
				t.Errorf("usage does not name the alias:\n%s", buf.String())
			}
		})
	}
}
