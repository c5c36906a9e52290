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
	s.fs.BoolVar(p, name, envValue(s, name, env, def, "a boolean", strconv.ParseBool), usage)
	s.add(name, env, strconv.FormatBool(def), usage, "")
}

// Int binds an integer setting.
func (s *Set) Int(p *int, name, env string, def int, usage string) {
	s.fs.IntVar(p, name, envValue(s, name, env, def, "an integer", strconv.Atoi), usage)
	s.add(name, env, strconv.Itoa(def), usage, "int")
}

// Float binds a floating-point setting.
func (s *Set) Float(p *float64, name, env string, def float64, usage string) {
	parse := func(v string) (float64, error) { return strconv.ParseFloat(v, 64) }
	s.fs.Float64Var(p, name, envValue(s, name, env, def, "a number", parse), usage)
	s.add(name, env, strconv.FormatFloat(def, 'g', -1, 64), usage, "float")
}

// Duration binds a duration setting such as "30s".
func (s *Set) Duration(p *time.Duration, name, env string, def time.Duration, usage string) {
	s.fs.DurationVar(p, name, envValue(s, name, env, def, "a duration", time.ParseDuration), usage)
	s.add(name, env, def.String(), usage, "duration")
}

// Strings binds a setting that may be given many times (`-e A=1 -e B=2`), also under a
// one-letter alias (empty: none). Its environment variable holds one value per line.
func (s *Set) Strings(p *[]string, name, alias, env, usage string) {
	if ev, ok := s.env(env); ok {
		for _, v := range strings.Split(ev, "\n") {
			if v != "" {
				*p = append(*p, v)
			}
		}
	}
	fromEnv := len(*p) > 0
	add := func(v string) error {
		if fromEnv { // flags replace the environment's values
			*p, fromEnv = nil, false
		}
		*p = append(*p, v)
		return nil
	}
	s.fs.Func(name, usage, add)
	if alias != "" {
		s.fs.Func(alias, usage, add)
	}
	s.add(name, env, `""`, usage+" (repeatable)", "string")
}

// Alias makes alias (one letter: `-t`) a second flag for the bound setting name. A boolean
// alias, like its setting, takes no value.
func (s *Set) Alias(alias, name string) {
	f := s.fs.Lookup(name)
	if f == nil {
		panic("config: alias " + alias + " of unbound setting " + name) // a programming error
	}
	s.fs.Var(f.Value, alias, f.Usage)
	for i, e := range s.entries {
		if e.flag == name {
			s.entries[i].usage += " (also -" + alias + ")"
		}
	}
}

// envValue is the setting's environment value, parsed, or def when the variable is unset. A
// value that does not parse is recorded for Parse to report, naming the variable and the flag.
func envValue[T any](s *Set, name, env string, def T, what string, parse func(string) (T, error)) T {
	ev, ok := s.env(env)
	if !ok {
		return def
	}
	v, err := parse(ev)
	if err != nil {
		s.envErrs = append(s.envErrs, fmt.Errorf("%s: %q is not %s (--%s)", env, ev, what, name))
		return def
	}
	return v
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
