// Certificates and keys for a throw-away control plane: a CA, a serving
// certificate for kube-apiserver, the service-account signing key pair, and
// client certificates for the components that authenticate as themselves
// (kubelets as system:node:<name>, kube-proxy, the scheduler...).
// openssl does the X.509 work (node:crypto cannot issue certificates).
import { generateKeyPairSync } from 'node:crypto';
import { readFileSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { execa } from 'execa';

export interface Pki {
  caCert: string;
  caKey: string;
  serverCert: string;
  serverKey: string;
  saPublic: string;
  saPrivate: string;
  /** PEM of the CA, for clients. */
  caPem: string;
}

const EC = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes'];

export async function createPki(dir: string, sans: { ips: string[]; dns: string[] }): Promise<Pki> {
  const p = (f: string) => join(dir, f);
  // An explicit config keeps openssl's distribution defaults (which mark
  // self-signed certificates as CAs) off the serving certificate.
  writeFileSync(
    p('openssl.cnf'),
    [
      '[req]',
      'distinguished_name = dn',
      'prompt = no',
      '[dn]',
      'CN = unused',
      '[ca]',
      'basicConstraints = critical,CA:TRUE',
      'keyUsage = critical,keyCertSign,cRLSign',
      'subjectKeyIdentifier = hash',
      '[server]',
      'basicConstraints = critical,CA:FALSE',
      'keyUsage = critical,digitalSignature,keyEncipherment',
      'extendedKeyUsage = serverAuth',
      `subjectAltName = ${[...sans.ips.map((i) => `IP:${i}`), ...sans.dns.map((d) => `DNS:${d}`)].join(',')}`,
      '[client]',
      'basicConstraints = critical,CA:FALSE',
      'keyUsage = critical,digitalSignature,keyEncipherment',
      'extendedKeyUsage = clientAuth',
      '',
    ].join('\n'),
  );
  const common = ['-config', p('openssl.cnf'), '-days', '2'];
  await execa('openssl', ['req', '-x509', ...EC, ...common, '-extensions', 'ca', '-subj', '/CN=pier-test-ca',
    '-keyout', p('ca.key'), '-out', p('ca.crt')]);
  await execa('openssl', ['req', '-x509', ...EC, ...common, '-extensions', 'server', '-subj', '/CN=kube-apiserver',
    '-CA', p('ca.crt'), '-CAkey', p('ca.key'), '-keyout', p('server.key'), '-out', p('server.crt')]);

  const sa = generateKeyPairSync('rsa', { modulusLength: 2048 });
  writeFileSync(p('sa.key'), sa.privateKey.export({ type: 'pkcs8', format: 'pem' }));
  writeFileSync(p('sa.pub'), sa.publicKey.export({ type: 'spki', format: 'pem' }));

  return {
    caCert: p('ca.crt'),
    caKey: p('ca.key'),
    serverCert: p('server.crt'),
    serverKey: p('server.key'),
    saPublic: p('sa.pub'),
    saPrivate: p('sa.key'),
    caPem: readFileSync(p('ca.crt'), 'utf8'),
  };
}

/**
 * A client certificate signed by the CA, for `cn` in groups `orgs` (the API
 * server reads the user from CN and the groups from O). Written next to the CA
 * as `<file>.crt` and `<file>.key`.
 */
export async function issueClientCert(pki: Pki, file: string, cn: string, orgs: string[] = []): Promise<{ cert: string; key: string }> {
  const dir = dirname(pki.caCert);
  const cert = join(dir, `${file}.crt`);
  const key = join(dir, `${file}.key`);
  const subj = [...orgs.map((o) => `/O=${o}`), `/CN=${cn}`].join('');
  await execa('openssl', ['req', '-x509', ...EC, '-config', join(dir, 'openssl.cnf'), '-days', '2', '-extensions', 'client', '-subj', subj,
    '-CA', pki.caCert, '-CAkey', pki.caKey, '-keyout', key, '-out', cert]);
  return { cert, key };
}
