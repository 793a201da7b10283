// Package testcerts makes a throwaway CA and certificates for TLS tests.
package testcerts

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// Set is a CA with a server certificate (IP SAN 127.0.0.1 and ::1, DNS
// localhost) and a client certificate, as PEM files in Dir.
type Set struct {
	Dir                   string
	CAFile                string
	ServerCert, ServerKey string
	ClientCert, ClientKey string
	Pool                  *x509.CertPool
	Server, Client        tls.Certificate
}

func write(path, kind string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600)
}

// New makes a Set in dir.
func New(dir string) (*Set, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "lockservice test CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	ca, _ := x509.ParseCertificate(caDER)
	s := &Set{Dir: dir, CAFile: filepath.Join(dir, "ca.pem"), Pool: x509.NewCertPool()}
	s.Pool.AddCert(ca)
	if err := write(s.CAFile, "CERTIFICATE", caDER); err != nil {
		return nil, err
	}
	leaf := func(serial int64, name string, ext x509.ExtKeyUsage, ips []net.IP, dns []string) (string, string, tls.Certificate, error) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return "", "", tls.Certificate{}, err
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial),
			Subject:      pkix.Name{CommonName: name},
			NotBefore:    now.Add(-time.Hour),
			NotAfter:     now.Add(24 * time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  []x509.ExtKeyUsage{ext},
			IPAddresses:  ips,
			DNSNames:     dns,
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return "", "", tls.Certificate{}, err
		}
		kder, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			return "", "", tls.Certificate{}, err
		}
		cp, kp := filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem")
		if err := write(cp, "CERTIFICATE", der); err != nil {
			return "", "", tls.Certificate{}, err
		}
		if err := write(kp, "PRIVATE KEY", kder); err != nil {
			return "", "", tls.Certificate{}, err
		}
		cert, err := tls.LoadX509KeyPair(cp, kp)
		return cp, kp, cert, err
	}
	s.ServerCert, s.ServerKey, s.Server, err = leaf(2, "server", x509.ExtKeyUsageServerAuth,
		[]net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1")}, []string{"localhost"})
	if err != nil {
		return nil, err
	}
	s.ClientCert, s.ClientKey, s.Client, err = leaf(3, "client", x509.ExtKeyUsageClientAuth, nil, nil)
	if err != nil {
		return nil, err
	}
	return s, nil
}

// ServerConfig is a server TLS config; with mutual, clients must present a
// certificate signed by the CA.
func (s *Set) ServerConfig(mutual bool) *tls.Config {
	cfg := &tls.Config{Certificates: []tls.Certificate{s.Server}}
	if mutual {
		cfg.ClientCAs = s.Pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg
}

// ClientConfig is a client TLS config trusting the CA, presenting the
// client certificate when withCert.
func (s *Set) ClientConfig(withCert bool) *tls.Config {
	cfg := &tls.Config{RootCAs: s.Pool}
	if withCert {
		cfg.Certificates = []tls.Certificate{s.Client}
	}
	return cfg
}
