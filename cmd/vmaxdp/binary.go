package main

import (
	"bufio"
	"debug/buildinfo"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// errNotInterposable is the reason `vmaxdp run` gives when the program it
// starts cannot have its socket calls interposed by the preload library.
var errNotInterposable = errors.New("its sockets cannot be intercepted")

// interposable says why prog's socket calls would not go through the
// preload library, or nil when they would: a Go program makes its system
// calls itself, a statically linked one never runs the dynamic loader that
// honours LD_PRELOAD. A script is judged by its interpreter.
func interposable(prog string) error {
	for depth := 0; depth < 4; depth++ {
		interp, err := scriptInterpreter(prog)
		if err != nil {
			return nil // unreadable: the exec will say what is wrong
		}
		if interp == "" {
			break
		}
		prog = interp
	}
	f, err := elf.Open(prog)
	if err != nil {
		return nil
	}
	defer f.Close()
	if _, err := buildinfo.ReadFile(prog); err == nil {
		return fmt.Errorf("%s is a Go program: %w: Go makes its socket system calls itself, not through libc, so every socket stays on the kernel. Serve its sockets with the Go package github.com/vmaxdp/vmaxdp/stack instead (stack.Open, ListenUDP, DialUDP)", prog, errNotInterposable)
	}
	dynamic := false
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			dynamic = true
		}
	}
	if !dynamic {
		return fmt.Errorf("%s is statically linked: %w: the dynamic loader, which honours LD_PRELOAD, never runs, so every socket stays on the kernel. Link it dynamically against glibc to offload it", prog, errNotInterposable)
	}
	return nil
}

// scriptInterpreter reads a "#!" line and returns the interpreter it names
// (through PATH for `#!/usr/bin/env name`), or "" when prog is no script.
func scriptInterpreter(prog string) (string, error) {
	f, err := os.Open(prog)
	if err != nil {
		return "", err
	}
	defer f.Close()
	line, err := bufio.NewReader(f).ReadString('\n')
	if !strings.HasPrefix(line, "#!") {
		return "", nil
	}
	if err != nil && line == "" {
		return "", err
	}
	fields := strings.Fields(strings.TrimPrefix(line, "#!"))
	if len(fields) == 0 {
		return "", nil
	}
	if strings.HasSuffix(fields[0], "/env") && len(fields) > 1 {
		return exec.LookPath(fields[1])
	}
	return fields[0], nil
}
