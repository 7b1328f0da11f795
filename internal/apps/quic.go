package apps

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// quicFiles and quicFileSize are what each QUIC connection downloads:
// that many files of that size, one stream each, at once.
const (
	quicFiles    = 8
	quicFileSize = 4 << 20
)

// quic is QUIC (HTTP/3) with ngtcp2's example server and client (Debian's
// ngtcp2-server and ngtcp2-client, built with GnuTLS): connections of the
// client one after the other for the run's time, each downloading
// quicFiles files at once, every file compared with the server's. The
// server cuts its sends with UDP_SEGMENT (UDP GSO) messages, reads with
// recvmsg and IP_PKTINFO and ECN (IP_RECVTOS), as QUIC servers do. The
// rate is the verified bytes' over the time the client's processes ran,
// their starts included (bash's EPOCHREALTIME: no process of its own),
// the checks between them not; Sent counts the files asked for, Lost
// those that did not come back whole.
func quic() *App {
	return &App{
		Name: "quic-ngtcp2", Unit: "Mbit/s", Programs: []string{"gtlsserver", "gtlsclient"}, Package: "ngtcp2-server ngtcp2-client",
		Proto: "udp", Port: 4433,
		// A file's bytes in datagrams of at most a 1500-byte MTU's payload.
		Datagrams: quicFileSize / 1472,
		Server: func(dir, addr string) []string {
			if err := quicSetup(dir); err != nil {
				// The server then fails to start, with this in its output.
				return []string{"sh", "-c", "echo " + strconv.Quote(err.Error()) + " >&2; exit 1"}
			}
			return []string{"gtlsserver", "-q", "-d", filepath.Join(dir, "htdocs"), addr, "4433",
				filepath.Join(dir, "quic.key"), filepath.Join(dir, "quic.crt")}
		},
		Client: func(dir, addr string, d time.Duration, paced bool) []string {
			var uris, names []string
			for i := range quicFiles {
				uris = append(uris, fmt.Sprintf("https://%s:4433/f%d", addr, i))
				names = append(names, fmt.Sprintf("f%d", i))
			}
			write(dir, map[string]string{"quic-client.sh": fmt.Sprintf(`end=$((${EPOCHREALTIME/[.,]/} + %[1]d))
asked=0 whole=0 bytes=0 us=0
while :; do
	rm -rf dl && mkdir dl
	start=${EPOCHREALTIME/[.,]/}
	gtlsclient -q --exit-on-all-streams-close --timeout=5s --download=dl %[2]s 4433 %[3]s > quic-client.log 2>&1 || { echo "gtlsclient failed ($?):"; tail -5 quic-client.log; }
	us=$((us + ${EPOCHREALTIME/[.,]/} - start))
	for f in %[4]s; do
		asked=$((asked + 1))
		if cmp -s dl/$f htdocs/$f; then whole=$((whole + 1)); bytes=$((bytes + %[5]d)); fi
	done
	[ ${EPOCHREALTIME/[.,]/} -ge $end ] && break
done
echo "quic: asked $asked whole $whole bytes $bytes us $us"
`, d.Microseconds(), addr, strings.Join(uris, " "), strings.Join(names, " "), quicFileSize)})
			return []string{"bash", filepath.Join(dir, "quic-client.sh")}
		},
		Parse: parseQUIC,
	}
}

var reQUIC = regexp.MustCompile(`quic: asked (\d+) whole (\d+) bytes (\d+) us (\d+)`)

func parseQUIC(out string) (Result, error) {
	var r Result
	m := reQUIC.FindStringSubmatch(out)
	if m == nil {
		return r, fmt.Errorf("the QUIC client printed no summary:\n%s", tail(out, 20))
	}
	asked, _ := strconv.ParseInt(m[1], 10, 64)
	whole, _ := strconv.ParseInt(m[2], 10, 64)
	bytes, _ := strconv.ParseFloat(m[3], 64)
	us, _ := strconv.ParseFloat(m[4], 64)
	r.Sent, r.Lost = asked, asked-whole
	if us > 0 {
		r.Rate = bytes * 8 / us // Mbit/s
	}
	return r, nil
}

// quicSetup writes the server's files into dir: the files it serves, of
// random bytes, and a self-signed certificate with its key.
func quicSetup(dir string) error {
	htdocs := filepath.Join(dir, "htdocs")
	if err := os.MkdirAll(htdocs, 0o755); err != nil {
		return err
	}
	buf := make([]byte, quicFileSize)
	for i := range quicFiles {
		rand.Read(buf)
		if err := os.WriteFile(filepath.Join(htdocs, fmt.Sprintf("f%d", i)), buf, 0o644); err != nil {
			return err
		}
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "vmaxdp.test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		DNSNames: []string{"vmaxdp.test"},
	}
	cert, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return err
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "quic.crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert}), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "quic.key"), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600)
}
