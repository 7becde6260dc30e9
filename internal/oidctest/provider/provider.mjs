// A real OpenID Connect provider for Baton's tests: oidc-provider, with a
// client that gets JWT access tokens through the client credentials grant
// and a resource indicator (the token's aud is the resource). Each start
// signs with a new RSA key of a new kid, so that restarting it on the same
// port rotates the key.
//
// Environment: PORT (required), CLIENT_ID and CLIENT_SECRET. It prints
// "ready <issuer> <kid>" once it listens.
import { generateKeyPairSync, randomUUID } from 'node:crypto';
import Provider from 'oidc-provider';

const port = Number(process.env.PORT);
if (!port) {
  console.error('PORT is required');
  process.exit(2);
}
const issuer = `http://127.0.0.1:${port}`;
const kid = randomUUID();
const { privateKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });
const jwk = { ...privateKey.export({ format: 'jwk' }), kid, use: 'sig', alg: 'RS256' };

const provider = new Provider(issuer, {
  clients: [{
    client_id: process.env.CLIENT_ID || 'baton-test-app',
    client_secret: process.env.CLIENT_SECRET || 'baton-test-secret',
    grant_types: ['client_credentials'],
    redirect_uris: [],
    response_types: [],
  }],
  jwks: { keys: [jwk] },
  features: {
    devInteractions: { enabled: false },
    clientCredentials: { enabled: true },
    resourceIndicators: {
      enabled: true,
      defaultResource: (ctx, client, oneOf) => oneOf,
      useGrantedResource: () => true,
      getResourceServerInfo: (ctx, resource) => ({
        scope: 'chat',
        audience: resource,
        accessTokenTTL: 300,
        accessTokenFormat: 'jwt',
        jwt: { sign: { alg: 'RS256' } },
      }),
    },
  },
});

provider.listen(port, '127.0.0.1', () => {
  console.log(`ready ${issuer} ${kid}`);
});
// Stopped at once: its keep-alive connections (Baton's key fetches) must
// not hold a restart up.
process.on('SIGTERM', () => process.exit(0));
