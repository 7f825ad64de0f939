package pki

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// Option configures a Reloader.
type Option func(*reloadConfig)

type reloadConfig struct {
	logger   *slog.Logger
	onReload func(error)
	now      func() time.Time
}

// WithLogger logs every reload (Info) and every rejected file (Warn) to l.
// Without it the Reloader logs nothing.
func WithLogger(l *slog.Logger) Option { return func(c *reloadConfig) { c.logger = l } }

// OnReload calls fn after each reload attempt that saw changed files: with
// nil when the new files were loaded, or with the error when they were
// rejected and the previous certificate or CA pool stays in use. It is
// called once per change, not on every poll; from the polling goroutine or
// from the caller of Reload, never concurrently, and it must not call
// Reload itself. Use it for metrics or tests.
func OnReload(fn func(err error)) Option { return func(c *reloadConfig) { c.onReload = fn } }

// Reloader holds a certificate and key pair and/or a CA pool loaded from
// files, and reloads them when the files' contents change.
//
// Change detection compares contents (a SHA-256 of each file), not mtime
// and size: ECDSA certificates of the same CA often have the same size,
// and some file systems keep mtimes to the second. Reading three small
// files every interval costs nothing.
//
// A replacement that does not load (unreadable, not PEM, the key does not
// match the certificate, the certificate has expired) is rejected: the
// previous good pair or pool stays in use, the error goes to OnReload and
// the logger once, and the next change of the files is tried again. The
// pair and the pool are independent: a bad certificate does not hold back
// a new CA bundle, nor the reverse.
//
// Replace files by rename (as pki.Issue with WithOverwrite does). If the
// certificate and key are replaced one after the other, a poll in between
// may see a mismatched pair; it is rejected, and the pair loads at the
// next poll.
type Reloader struct {
	certFile, keyFile, caFile string
	cfg                       reloadConfig

	pair atomic.Pointer[tls.Certificate]
	pool atomic.Pointer[x509.CertPool]

	mu               sync.Mutex // serializes reloads
	pairSeen, caSeen [sha256.Size]byte
	pairErr, caErr   error

	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

// NewReloader loads certFile and keyFile (both or neither) and caFile
// (optional; a PEM bundle of one or more CA certificates) and, if
// reloadEvery is positive, checks them for changes every reloadEvery until
// Close. With reloadEvery <= 0 only Reload reloads (for example on SIGHUP).
// The first load must succeed.
func NewReloader(certFile, keyFile, caFile string, reloadEvery time.Duration, opts ...Option) (*Reloader, error) {
	if (certFile == "") != (keyFile == "") {
		return nil, errors.New("pki: a certificate needs its key: give both the certificate and the key file, or neither")
	}
	if certFile == "" && caFile == "" {
		return nil, errors.New("pki: nothing to load: give a certificate and key, a CA file, or both")
	}
	r := &Reloader{certFile: certFile, keyFile: keyFile, caFile: caFile}
	r.cfg.now = time.Now
	for _, o := range opts {
		o(&r.cfg)
	}
	if r.cfg.logger == nil {
		r.cfg.logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if certFile != "" {
		if _, err := r.reloadPair(); err != nil {
			return nil, err
		}
	}
	if caFile != "" {
		if _, err := r.reloadCA(); err != nil {
			return nil, err
		}
	}
	if reloadEvery > 0 {
		r.stop, r.done = make(chan struct{}), make(chan struct{})
		go r.poll(reloadEvery)
	}
	return r, nil
}

func (r *Reloader) poll(every time.Duration) {
	defer close(r.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-t.C:
			_ = r.Reload() // reported through OnReload and the logger
		}
	}
}

// Close stops polling. The Reloader keeps serving what it last loaded.
// Close is idempotent.
func (r *Reloader) Close() error {
	r.closeOnce.Do(func() {
		if r.stop != nil {
			close(r.stop)
			<-r.done
		}
	})
	return nil
}

// Reload checks the files now and loads what changed. It returns nil when
// the files in place are the ones being served, or the error that keeps
// them from being served (also when that error was reported before).
func (r *Reloader) Reload() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	var changed bool
	var errs []error
	if r.certFile != "" {
		ch, err := r.reloadPair()
		changed = changed || ch
		errs = append(errs, err)
	}
	if r.caFile != "" {
		ch, err := r.reloadCA()
		changed = changed || ch
		errs = append(errs, err)
	}
	err := errors.Join(errs...)
	if changed && r.cfg.onReload != nil {
		r.cfg.onReload(err)
	}
	return err
}

// Certificate returns the pair being served, or nil if none is configured.
func (r *Reloader) Certificate() *tls.Certificate { return r.pair.Load() }

// CAPool returns the CA pool being served, or nil if none is configured.
// Each reload makes a new pool; a returned pool is never modified.
func (r *Reloader) CAPool() *x509.CertPool { return r.pool.Load() }

// GetCertificate serves the current pair; use it as tls.Config.GetCertificate.
func (r *Reloader) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	if c := r.pair.Load(); c != nil {
		return c, nil
	}
	return nil, errors.New("pki: no certificate configured")
}

// GetClientCertificate serves the current pair (or, if none is configured,
// no certificate); use it as tls.Config.GetClientCertificate.
func (r *Reloader) GetClientCertificate(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	if c := r.pair.Load(); c != nil {
		return c, nil
	}
	return &tls.Certificate{}, nil
}

// reloadPair loads the pair if the files changed since the last attempt.
// It returns whether they changed and the error of the files in place.
func (r *Reloader) reloadPair() (changed bool, err error) {
	certPEM, certErr := os.ReadFile(r.certFile)
	keyPEM, keyErr := os.ReadFile(r.keyFile)
	sum := fingerprint(certPEM, certErr, keyPEM, keyErr)
	if r.pair.Load() != nil && sum == r.pairSeen {
		return false, r.pairErr
	}
	r.pairSeen = sum
	pair, err := r.parsePair(certPEM, certErr, keyPEM, keyErr)
	if err != nil {
		if old := r.pair.Load(); old != nil {
			err = fmt.Errorf("%w; still serving the previous certificate (valid until %s)", err, old.Leaf.NotAfter.UTC().Format(time.RFC3339))
			r.cfg.logger.Warn("TLS certificate not reloaded", "cert", r.certFile, "key", r.keyFile, "err", err)
		}
		r.pairErr = err
		return true, err
	}
	first := r.pair.Load() == nil
	r.pair.Store(pair)
	r.pairErr = nil
	if !first {
		r.cfg.logger.Info("TLS certificate reloaded", "cert", r.certFile, "subject", pair.Leaf.Subject.CommonName, "uris", pair.Leaf.URIs, "not_after", pair.Leaf.NotAfter.UTC())
	}
	return true, nil
}

func (r *Reloader) parsePair(certPEM []byte, certErr error, keyPEM []byte, keyErr error) (*tls.Certificate, error) {
	if certErr != nil {
		return nil, fmt.Errorf("pki: certificate: %w", certErr)
	}
	if keyErr != nil {
		return nil, fmt.Errorf("pki: key: %w", keyErr)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("pki: certificate %s with key %s: %v", r.certFile, r.keyFile, err)
	}
	if pair.Leaf == nil {
		if pair.Leaf, err = x509.ParseCertificate(pair.Certificate[0]); err != nil {
			return nil, fmt.Errorf("pki: certificate %s: %v", r.certFile, err)
		}
	}
	if now := r.cfg.now(); now.After(pair.Leaf.NotAfter) {
		return nil, fmt.Errorf("pki: certificate %s expired at %s", r.certFile, pair.Leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	return &pair, nil
}

// reloadCA is reloadPair for the CA pool.
func (r *Reloader) reloadCA() (changed bool, err error) {
	raw, readErr := os.ReadFile(r.caFile)
	sum := fingerprint(raw, readErr)
	if r.pool.Load() != nil && sum == r.caSeen {
		return false, r.caErr
	}
	r.caSeen = sum
	var certs []*x509.Certificate
	if readErr != nil {
		err = fmt.Errorf("pki: CA file: %w", readErr)
	} else if certs, err = parseCerts(r.caFile, raw); err != nil {
		err = fmt.Errorf("pki: CA file %w", err)
	}
	if err != nil {
		if r.pool.Load() != nil {
			err = fmt.Errorf("%w; still using the previous CA pool", err)
			r.cfg.logger.Warn("TLS CA file not reloaded", "ca", r.caFile, "err", err)
		}
		r.caErr = err
		return true, err
	}
	pool := x509.NewCertPool()
	for _, c := range certs {
		pool.AddCert(c)
	}
	first := r.pool.Load() == nil
	r.pool.Store(pool)
	r.caErr = nil
	if !first {
		r.cfg.logger.Info("TLS CA pool reloaded", "ca", r.caFile, "certificates", len(certs))
	}
	return true, nil
}

// fingerprint hashes file contents, or their read errors, in order.
func fingerprint(parts ...any) [sha256.Size]byte {
	h := sha256.New()
	for _, p := range parts {
		switch v := p.(type) {
		case []byte:
			fmt.Fprintf(h, "%d:", len(v))
			h.Write(v)
		case error:
			if v != nil {
				fmt.Fprintf(h, "err:%s", v)
			}
		}
		h.Write([]byte{0})
	}
	var sum [sha256.Size]byte
	copy(sum[:], h.Sum(nil))
	return sum
}
