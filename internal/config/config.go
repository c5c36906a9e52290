// Package config binds a binary's typed configuration to flags and environment variables.
//
// Precedence is defaults, then environment, then flags. Every setting has exactly one flag and one
// environment variable, and --help lists both with the default, so an operator never has to read
// the source to learn how to set something.
package config

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// LookupEnv has the signature of os.LookupEnv; tests pass a map-backed one.
type LookupEnv func(key string) (string, bool)

// Set is a private flag set whose flags also read an environment variable.
type Set struct {
	fs      *flag.FlagSet
	lookup  LookupEnv
	entries []entry
	envErrs []error
}

type entry struct {
	flag, env, def, usage, kind string
}

// New returns an empty Set for the named binary.
func New(name string, lookup LookupEnv) *Set {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return &Set{fs: fs, lookup: lookup}
}

// String binds a string setting.
func (s *Set) String(p *string, name, env, def, usage string) {
	v := def
	if ev, ok := s.env(env); ok {
		v = ev
	}
	s.fs.StringVar(p, name, v, usage)
	s.add(name, env, strconv.Quote(def), usage, "string")
}

// Bool binds a boolean setting.
func (s *Set) Bool(p *bool, name, env string, def bool, usage string) {
	v := def
	if ev, ok := s.env(env); ok {
		b, err := strconv.ParseBool(ev)
		if err != nil {
			s.envErrs = append(s.envErrs, fmt.Errorf("%s: %q is not a boolean (--%s)", env, ev, name))
		}
		v = b
	}
	s.fs.BoolVar(p, name, v, usage)
	s.add(name, env, strconv.FormatBool(def), usage, "")
}

// Int binds an integer setting.
func (s *Set) Int(p *int, name, env string, def int, usage string) {
	v := def
	if ev, ok := s.env(env); ok {
		n, err := strconv.Atoi(ev)
		if err != nil {
			s.envErrs = append(s.envErrs, fmt.Errorf("%s: %q is not an integer (--%s)", env, ev, name))
		}
		v = n
	}
	s.fs.IntVar(p, name, v, usage)
	s.add(name, env, strconv.Itoa(def), usage, "int")
}

// Float binds a floating-point setting.
func (s *Set) Float(p *float64, name, env string, def float64, usage string) {
	v := def
	if ev, ok := s.env(env); ok {
		f, err := strconv.ParseFloat(ev, 64)
		if err != nil {
			s.envErrs = append(s.envErrs, fmt.Errorf("%s: %q is not a number (--%s)", env, ev, name))
		}
		v = f
	}
	s.fs.Float64Var(p, name, v, usage)
	s.add(name, env, strconv.FormatFloat(def, 'g', -1, 64), usage, "float")
}

// Duration binds a duration setting such as "30s".
func (s *Set) Duration(p *time.Duration, name, env string, def time.Duration, usage string) {
	v := def
	if ev, ok := s.env(env); ok {
		d, err := time.ParseDuration(ev)
		if err != nil {
			s.envErrs = append(s.envErrs, fmt.Errorf("%s: %q is not a duration (--%s)", env, ev, name))
		}
		v = d
	}
	s.fs.DurationVar(p, name, v, usage)
	s.add(name, env, def.String(), usage, "duration")
}

// Parse reads the environment (already applied when each setting was bound) and then args.
// It returns flag.ErrHelp when --help was asked for; the caller prints Usage and exits 0.
func (s *Set) Parse(args []string) error {
	if err := s.fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%w (see --help)", err)
	}
	if s.fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q (see --help)", s.fs.Arg(0))
	}
	return errors.Join(s.envErrs...)
}

// Usage writes every setting with its flag, environment variable and default.
func (s *Set) Usage(w io.Writer, summary string) {
	fmt.Fprintf(w, "%s\n\nUsage: %s [flags]\n\nFlags (each also read from the environment variable shown):\n", summary, s.fs.Name())
	for _, e := range s.entries {
		name := "--" + e.flag
		if e.kind != "" {
			name += " " + e.kind
		}
		fmt.Fprintf(w, "  %s\n        %s\n        env %s, default %s\n", name, e.usage, e.env, e.def)
	}
}

// Names returns the flag and environment variable of a setting, for error messages
// such as "--ack-wait must be > 0 (KUBECLIP_ACK_WAIT)".
func (s *Set) Names(flagName string) string {
	for _, e := range s.entries {
		if e.flag == flagName {
			return fmt.Sprintf("--%s (%s)", e.flag, e.env)
		}
	}
	return "--" + flagName
}

func (s *Set) env(key string) (string, bool) {
	if s.lookup == nil || key == "" {
		return "", false
	}
	v, ok := s.lookup(key)
	if !ok || strings.TrimSpace(v) == "" {
		return "", false
	}
	return v, true
}

func (s *Set) add(name, env, def, usage, kind string) {
	s.entries = append(s.entries, entry{flag: name, env: env, def: def, usage: usage, kind: kind})
}
