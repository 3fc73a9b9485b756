// client-node 2.0 builds a new undici Agent for every request
// (KubeConfig.applySecurityAuthentication calls an uncached
// createDispatcher), so every API call opens a new TLS connection: a
// handshake on both ends, a new SecureContext, and an idle socket left open
// until undici's keep-alive timeout. At a few hundred writes a second that is
// most of a controller's CPU and much of the API server's. reuseConnections
// keeps the first dispatcher made for a given server and TLS material and
// hands it to every later request, as client-go's transport cache does.
import type { KubeConfig } from '@kubernetes/client-node';

type Dispatcher = NonNullable<ReturnType<import('@kubernetes/client-node').RequestContext['getDispatcher']>>;

/** What the dispatcher is built from; undefined when it may change between requests (exec and auth-provider plugins can supply client certificates). */
function tlsIdentity(kc: KubeConfig): string | undefined {
  const cluster = kc.getCurrentCluster();
  const user = kc.getCurrentUser();
  if (!cluster || user?.exec || user?.authProvider) return undefined;
  return JSON.stringify([
    cluster.server,
    cluster.caData,
    cluster.caFile,
    cluster.skipTLSVerify,
    cluster.tlsServerName,
    cluster.proxyUrl,
    user?.certData,
    user?.certFile,
    user?.keyData,
    user?.keyFile,
  ]);
}

/** Makes every request made through `kc` (API clients, watches) share connections. Returns `kc`. */
export function reuseConnections(kc: KubeConfig): KubeConfig {
  const apply = kc.applySecurityAuthentication.bind(kc);
  const shared = new Map<string, Dispatcher>();
  kc.applySecurityAuthentication = async (ctx) => {
    await apply(ctx);
    const key = tlsIdentity(kc);
    const fresh = ctx.getDispatcher();
    if (key === undefined || !fresh) return;
    const kept = shared.get(key);
    // The fresh one has opened nothing yet: dropping it costs nothing.
    if (kept) ctx.setDispatcher(kept);
    else shared.set(key, fresh);
  };
  return kc;
}
