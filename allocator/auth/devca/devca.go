// Package devca is a small certificate authority for development and
// tests: an ECDSA P-256 CA that issues the server, agent and user
// certificates Leasehold's TLS expects (docs/security.md). It uses
// crypto/x509 only. Production deployments bring their own PKI; the
// certificates only need the same identities (auth.AgentURI,
// auth.UserURI).
package devca

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"time"

	"leasehold/allocator/auth"
)

// CA is a certificate authority: its certificate and key.
type CA struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
}

// Pair is an issued certificate and its key, PEM encoded.
type Pair struct {
	CertPEM, KeyPEM []byte
}

// TLS returns the pair as a tls.Certificate.
func (p Pair) TLS() (tls.Certificate, error) { return tls.X509KeyPair(p.CertPEM, p.KeyPEM) }

// Leaf parses the certificate.
func (p Pair) Leaf() (*x509.Certificate, error) {
	b, _ := pem.Decode(p.CertPEM)
	if b == nil {
		return nil, errors.New("devca: no PEM certificate")
	}
	return x509.ParseCertificate(b.Bytes)
}

// New makes a CA valid from notBefore to notAfter.
func New(name string, notBefore, notAfter time.Time) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: name, Organization: []string{"Leasehold"}},
		NotBefore: notBefore, NotAfter: notAfter,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true, IsCA: true, MaxPathLenZero: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("devca: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, Key: key}, nil
}

// Load reads a CA from its PEM certificate and key.
func Load(certPEM, keyPEM []byte) (*CA, error) {
	b, _ := pem.Decode(certPEM)
	if b == nil || b.Type != "CERTIFICATE" {
		return nil, errors.New("devca: CA certificate: no PEM CERTIFICATE block")
	}
	cert, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		return nil, fmt.Errorf("devca: CA certificate: %w", err)
	}
	kb, _ := pem.Decode(keyPEM)
	if kb == nil {
		return nil, errors.New("devca: CA key: no PEM block")
	}
	k, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("devca: CA key: %w", err)
	}
	key, ok := k.(*ecdsa.PrivateKey)
	if !ok || !cert.IsCA || !key.PublicKey.Equal(cert.PublicKey) {
		return nil, errors.New("devca: CA key does not match the CA certificate")
	}
	return &CA{Cert: cert, Key: key}, nil
}

// CertPEM is the CA certificate, PEM encoded (the trust anchor callers load).
func (ca *CA) CertPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Cert.Raw})
}

// KeyPEM is the CA key, PKCS #8 PEM encoded.
func (ca *CA) KeyPEM() []byte {
	der, _ := x509.MarshalPKCS8PrivateKey(ca.Key)
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
}

// Pool is a cert pool holding only the CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// Request says what to issue.
type Request struct {
	CommonName string
	// Hosts are DNS names and IP addresses (server certificates).
	Hosts []string
	// URIs are URI SANs (identities: auth.AgentURI, auth.UserURI).
	URIs                []*url.URL
	NotBefore, NotAfter time.Time
	// Server and Client set the extended key usages.
	Server, Client bool
}

// Issue signs a new key's certificate.
func (ca *CA) Issue(r Request) (Pair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Pair{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: r.CommonName, Organization: []string{"Leasehold"}},
		NotBefore: r.NotBefore, NotAfter: r.NotAfter, URIs: r.URIs,
		KeyUsage: x509.KeyUsageDigitalSignature, BasicConstraintsValid: true,
	}
	for _, h := range r.Hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	if r.Server {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
	}
	if r.Client {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageClientAuth)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return Pair{}, fmt.Errorf("devca: %w", err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return Pair{}, err
	}
	return Pair{
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}),
	}, nil
}

// Server issues a server certificate for hosts, valid for d from now
// (less a minute, for clocks slightly behind). It may also be presented
// as a client certificate (a gateway to an agent that asks for one); it
// names no identity, so the allocator does not accept it as a caller.
func (ca *CA) Server(hosts []string, d time.Duration) (Pair, error) {
	now := time.Now()
	return ca.Issue(Request{CommonName: "leasehold server", Hosts: hosts, NotBefore: now.Add(-time.Minute), NotAfter: now.Add(d),
		Server: true, Client: true})
}

// Agent issues region's agent client certificate (leasehold://agent/REGION).
func (ca *CA) Agent(region string, d time.Duration) (Pair, error) {
	now := time.Now()
	return ca.Issue(Request{CommonName: "leasehold agent " + region, URIs: []*url.URL{auth.AgentURI(region)},
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(d), Client: true})
}

// User issues a user's client certificate (leasehold://user/NAME).
func (ca *CA) User(name string, d time.Duration) (Pair, error) {
	now := time.Now()
	return ca.Issue(Request{CommonName: name, URIs: []*url.URL{auth.UserURI(name)},
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(d), Client: true})
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n.Add(n, big.NewInt(1))
}
