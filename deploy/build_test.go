package deploy_test

import (
	"bytes"
	"debug/elf"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// The aether binary built with the Dockerfile's own go build command, once
// per test binary (several tests run it; a build costs a minute here).
var dockerBuild struct {
	once sync.Once
	dir  string
	bin  string
	err  error
	log  string
}

func TestMain(m *testing.M) {
	code := m.Run()
	if dockerBuild.dir != "" {
		os.RemoveAll(dockerBuild.dir)
	}
	os.Exit(code)
}

// buildLikeDockerfile runs the Dockerfile's go build RUN here: its
// environment and flags, with the ARGs at their defaults except the target
// platform (this machine's, to run the result), VERSION and COMMIT (fixed,
// to check the stamp), and -o into a temp dir.
func buildLikeDockerfile(t *testing.T) string {
	t.Helper()
	src := readDockerfile(t)
	dockerBuild.once.Do(func() {
		stages, err := parseDockerfile(src)
		if err != nil {
			dockerBuild.err = err
			return
		}
		// The stage the final stage's binary comes from.
		var build dockerStage
		for _, st := range stages {
			if st.name == "build" {
				build = st
			}
		}
		b, _, err := findGoBuild(build)
		if err != nil {
			dockerBuild.err = err
			return
		}
		args := map[string]string{}
		for _, in := range build.instr {
			if in.cmd == "ARG" {
				k, v, _ := strings.Cut(in.args, "=")
				args[k] = v
			}
		}
		args["TARGETOS"], args["TARGETARCH"] = runtime.GOOS, runtime.GOARCH
		args["VERSION"], args["COMMIT"] = "v0.0.0-dockerfile-test", "0123456789abcdef"
		expand := func(s string) string {
			return os.Expand(s, func(k string) string { return args[k] })
		}
		dir, err := os.MkdirTemp("", "aether-dockerfile-build-")
		if err != nil {
			dockerBuild.err = err
			return
		}
		dockerBuild.dir = dir
		bin := filepath.Join(dir, "aether")
		goArgs := []string{"build"}
		for i := 0; i < len(b.args); i++ {
			a := expand(b.args[i])
			if a == "-o" {
				goArgs = append(goArgs, "-o", bin)
				i++
				continue
			}
			goArgs = append(goArgs, a)
		}
		cmd := exec.Command("go", goArgs...)
		cmd.Dir = ".." // the Dockerfile builds from the repository root (WORKDIR /src, COPY . .)
		cmd.Env = os.Environ()
		for k, v := range b.env {
			cmd.Env = append(cmd.Env, k+"="+expand(v))
		}
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		start := time.Now()
		err = cmd.Run()
		dockerBuild.log = "go " + strings.Join(goArgs, " ") + "\n" + out.String()
		if err != nil {
			dockerBuild.err = err
			return
		}
		dockerBuild.bin = bin
		dockerBuild.log += "built in " + time.Since(start).Round(time.Second).String()
	})
	if dockerBuild.err != nil {
		t.Fatalf("the Dockerfile's go build, run here: %v\n%s", dockerBuild.err, dockerBuild.log)
	}
	return dockerBuild.bin
}

// The Dockerfile's build command works here, and what it makes is static:
// no ELF interpreter and no shared library, so it runs on distroless
// static, which has no libc.
func TestDockerfileBuildIsStatic(t *testing.T) {
	bin := buildLikeDockerfile(t)
	t.Log(dockerBuild.log)
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatalf("open the built binary as ELF: %v", err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("the binary has an ELF interpreter (PT_INTERP): it is dynamically linked")
		}
	}
	libs, err := f.ImportedLibraries()
	if err != nil {
		t.Fatalf("read the binary's dynamic section: %v", err)
	}
	if len(libs) > 0 {
		t.Errorf("the binary needs shared libraries %v", libs)
	}
	if f.Section(".dynamic") != nil {
		t.Errorf("the binary has a .dynamic section")
	}
	// -s -w: no symbol table (smaller image); -trimpath: no build paths.
	if f.Section(".symtab") != nil {
		t.Errorf("the binary has a symbol table: -ldflags -s was not applied")
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	if wd, _ := filepath.Abs(".."); bytes.Contains(data, []byte(wd+"/")) {
		t.Errorf("the binary contains the build directory %s: -trimpath was not applied", wd)
	}
	// file(1) agrees, where it is installed.
	if filePath, err := exec.LookPath("file"); err == nil {
		out, err := exec.Command(filePath, bin).CombinedOutput()
		if err != nil {
			t.Fatalf("file %s: %v\n%s", bin, err, out)
		}
		if !regexp.MustCompile(`statically linked|static-pie linked`).Match(out) {
			t.Errorf("file says the binary is not static: %s", out)
		}
	}
	// It runs, and the Dockerfile's -X flags stamped the version.
	out, err := exec.Command(bin, "version", "-o", "json").Output()
	if err != nil {
		t.Fatalf("aether version: %v", err)
	}
	var v struct{ Version, Commit string }
	if err := json.Unmarshal(out, &v); err != nil {
		t.Fatalf("aether version -o json: %v: %s", err, out)
	}
	if v.Version != "v0.0.0-dockerfile-test" || v.Commit != "0123456789abcdef" {
		t.Errorf("aether version = %+v, want the VERSION and COMMIT build args", v)
	}
}

// The check above must be able to fail: a cgo build of the same binary is
// dynamically linked and the ELF check says so.
func TestStaticCheckCatchesDynamicBinary(t *testing.T) {
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("no C compiler here: cannot make a dynamically linked binary to check against")
	}
	dir := t.TempDir()
	srcFile := filepath.Join(dir, "main.go")
	// net with cgo links libc's resolver: a dynamic binary.
	if err := os.WriteFile(srcFile, []byte("package main\nimport \"net\"\nfunc main() { net.LookupHost(\"localhost\") }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "dyn")
	cmd := exec.Command("go", "build", "-o", bin, srcFile)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1", "GOFLAGS=")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("cgo build: %v\n%s", err, out)
	}
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	libs, _ := f.ImportedLibraries()
	interp := false
	for _, p := range f.Progs {
		interp = interp || p.Type == elf.PT_INTERP
	}
	if !interp || len(libs) == 0 {
		t.Fatalf("a cgo binary looked static to the check (interp %v, libs %v)", interp, libs)
	}
}
