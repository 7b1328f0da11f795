package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/vmaxdp/vmaxdp/internal/params"
	"github.com/vmaxdp/vmaxdp/internal/rules"
	"github.com/vmaxdp/vmaxdp/stack"
	"github.com/vmaxdp/vmaxdp/verbs"
)

// libName is the preload library, built from ./preload.
const libName = "libvmaxdp.so"

// findLib looks for the preload library: VMAXDP_LIB, then beside the
// vmaxdp binary, then in ../lib/vmaxdp.
func findLib() (string, error) {
	if p := os.Getenv("VMAXDP_LIB"); p != "" {
		return p, nil
	}
	exe, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("find %s: %w", libName, err)
	}
	dir := filepath.Dir(exe)
	tried := []string{filepath.Join(dir, libName), filepath.Join(dir, "..", "lib", "vmaxdp", libName)}
	for _, p := range tried {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found (tried %s; build it with make build, or set VMAXDP_LIB)", libName, strings.Join(tried, ", "))
}

// runRun is `vmaxdp run [flags] -- app args`: it checks the parameters and
// the rules file, then execs the application with the preload library.
func runRun(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("vmaxdp run", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() {
		fmt.Fprintln(out, "usage: vmaxdp run [flags] [--] program [args...]\n\nEvery VMAXDP_* parameter (vmaxdp params) is read from the environment; the flags set the common ones.")
		fs.PrintDefaults()
	}
	set := map[string]*string{}
	flagParam := func(flagName, param, help string) {
		set[param] = fs.String(flagName, "", help+" ("+params.Prefix+param+")")
	}
	flagParam("config", "CONFIG_FILE", "rules file in libvma.conf syntax")
	flagParam("app-id", "APPLICATION_ID", "application-id of the rules file to apply")
	flagParam("interface", "INTERFACE", "interface for sockets bound to 0.0.0.0")
	flagParam("rx-poll", "RX_POLL", "receive polls before sleeping (-1 forever)")
	flagParam("select-poll", "SELECT_POLL", "microseconds select/poll/epoll poll before sleeping (-1 forever)")
	flagParam("trace-level", "TRACELEVEL", "log level 0-6")
	flagParam("log-file", "LOG_FILE", "log file (%d: pid)")
	flagParam("stats-file", "STATS_FILE", "socket counters written at close")
	lib := fs.String("lib", "", "preload library (default: "+libName+" beside vmaxdp, or VMAXDP_LIB)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return errUsage
	}
	env := os.Environ()
	for name, v := range set {
		if *v != "" {
			env = setEnv(env, params.Prefix+name, *v)
		}
	}
	lookup := func(k string) (string, bool) {
		for _, kv := range env {
			if name, v, _ := strings.Cut(kv, "="); name == k {
				return v, true
			}
		}
		return "", false
	}
	p, err := params.Load(lookup)
	if err != nil {
		return err
	}
	if _, err := rules.Load(p.ConfigFile); err != nil && !(errors.Is(err, os.ErrNotExist) && p.ConfigFile == params.Defaults().ConfigFile) {
		return err
	}
	if p.Backend == "verbs" {
		if err := verbsUsable(p.Interface); err != nil {
			return err
		}
	}
	path := *lib
	if path == "" {
		if path, err = findLib(); err != nil {
			return err
		}
	}
	if path, err = filepath.Abs(path); err != nil {
		return err
	}
	if _, err := os.Stat(path); err != nil {
		return fmt.Errorf("preload library: %w", err)
	}
	preload := path
	if old, ok := lookup("LD_PRELOAD"); ok && old != "" {
		preload += " " + old
	}
	env = setEnv(env, "LD_PRELOAD", preload)
	prog, err := exec.LookPath(fs.Arg(0))
	if err != nil {
		return err
	}
	if err := interposable(prog); err != nil {
		fmt.Fprintf(os.Stderr, "vmaxdp run: %v\n", err)
	}
	return syscall.Exec(prog, fs.Args(), env)
}

// verbsUsable checks, before the program starts, that the verbs backend
// can serve ifname, or when it is "" some up interface with an IPv4
// address: otherwise every socket would stay on the kernel.
func verbsUsable(ifname string) error {
	names := []string{ifname}
	if ifname == "" {
		var err error
		if names, err = stack.IPv4Interfaces(); err != nil {
			return err
		}
	}
	if len(names) == 0 {
		return fmt.Errorf("%sBACKEND=verbs: no interface is up with an IPv4 address", params.Prefix)
	}
	var why []string
	for _, name := range names {
		_, err := verbs.Probe(name)
		if err == nil {
			return nil
		}
		why = append(why, err.Error())
	}
	return fmt.Errorf("%sBACKEND=verbs: no interface can use it: %s", params.Prefix, strings.Join(why, "; "))
}

func setEnv(env []string, k, v string) []string {
	for i, kv := range env {
		if strings.HasPrefix(kv, k+"=") {
			env[i] = k + "=" + v
			return env
		}
	}
	return append(env, k+"="+v)
}

// runParams is `vmaxdp params`: every parameter, its default and meaning;
// with -env, the values the current environment gives them.
func runParams(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("vmaxdp params", flag.ContinueOnError)
	fs.SetOutput(out)
	current := fs.Bool("env", false, "show the values the environment sets, as the start-up banner does")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if !*current {
		params.WriteDoc(out)
		return nil
	}
	p, err := params.FromEnv()
	if err != nil {
		return err
	}
	for _, d := range params.All {
		fmt.Fprintf(out, "%s%s=%s\n", params.Prefix, d.Name, strconv.Quote(p.Value(d)))
	}
	return nil
}
