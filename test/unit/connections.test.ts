import { KubeConfig, RequestContext, HttpMethod } from '@kubernetes/client-node';
import { describe, expect, it } from 'vitest';
import { reuseConnections } from '../../lib/connections.ts';

const CA = Buffer.from('-----BEGIN CERTIFICATE-----\nnot parsed until a connection is made\n-----END CERTIFICATE-----\n').toString('base64');

function kubeConfig(user: Record<string, unknown>): KubeConfig {
  const kc = new KubeConfig();
  kc.loadFromOptions({
    clusters: [{ name: 'c', server: 'https://198.51.100.254:6443', caData: CA }],
    users: [{ name: 'u', ...user }],
    contexts: [{ name: 'ctx', cluster: 'c', user: 'u' }],
    currentContext: 'ctx',
  });
  return kc;
}

async function dispatcherOf(kc: KubeConfig) {
  const ctx = new RequestContext('https://198.51.100.254:6443/api/v1/services', HttpMethod.GET);
  await kc.applySecurityAuthentication(ctx);
  return { dispatcher: ctx.getDispatcher(), auth: ctx.getHeaders()['Authorization'] };
}

describe('reuseConnections', () => {
  it('is needed: client-node hands every request a new dispatcher', async () => {
    const kc = kubeConfig({ token: 't' });
    expect((await dispatcherOf(kc)).dispatcher).not.toBe((await dispatcherOf(kc)).dispatcher);
  });

  it('hands every request the same dispatcher, and still authenticates each', async () => {
    const kc = reuseConnections(kubeConfig({ token: 't' }));
    const a = await dispatcherOf(kc);
    const b = await dispatcherOf(kc);
    expect(a.dispatcher).toBeDefined();
    expect(b.dispatcher).toBe(a.dispatcher);
    expect(b.auth).toBe('Bearer t');
  });

  it('keeps one per server and TLS identity', async () => {
    const kc = reuseConnections(kubeConfig({ token: 't' }));
    const first = (await dispatcherOf(kc)).dispatcher;
    kc.addCluster({ name: 'other', server: 'https://198.51.100.253:6443', caData: CA, skipTLSVerify: false });
    kc.addContext({ name: 'other', cluster: 'other', user: 'u' });
    kc.setCurrentContext('other');
    const second = (await dispatcherOf(kc)).dispatcher;
    expect(second).not.toBe(first);
    expect((await dispatcherOf(kc)).dispatcher).toBe(second);
  });
});
