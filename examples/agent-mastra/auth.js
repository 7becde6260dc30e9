// Checks that a step request comes from Baton: its bearer token is a JWT
// signed by the worker's Ed25519 key, whose public half the API serves at
// /.well-known/jwks.json (docs/guides/agent-keys.md).
import { createRemoteJWKSet, jwtVerify } from "jose";

// Refused is a request whose token does not show that it comes from
// Baton: the agent answers 401.
export class Refused extends Error {}

// KeysUnavailable is a token that could not be checked because Baton's
// keys could not be fetched: the agent answers 503, and Baton tries the
// step again later.
export class KeysUnavailable extends Error {}

// Error codes of jose that are the token's fault, not the key set's.
const tokenFaults = new Set([
  "ERR_JWKS_NO_MATCHING_KEY",
  "ERR_JWKS_MULTIPLE_MATCHING_KEYS",
  "ERR_JOSE_ALG_NOT_ALLOWED",
  "ERR_JOSE_NOT_SUPPORTED",
]);

// batonVerifier returns verify(authorization), which resolves to whom the
// step is for, or rejects with Refused or KeysUnavailable.
export function batonVerifier({ jwksURL, issuer, audience }) {
  // Fetched on first use, and again for a kid not among them (a new key),
  // at most every 30 seconds.
  const keys = createRemoteJWKSet(new URL(jwksURL));
  return async function verify(authorization) {
    const [scheme, token] = (authorization ?? "").split(" ");
    if (scheme !== "Bearer" || !token) throw new Refused("no bearer token");
    let payload;
    try {
      ({ payload } = await jwtVerify(token, keys, {
        algorithms: ["EdDSA"],
        typ: "JWT",
        issuer,
        audience,
        requiredClaims: ["exp", "sub", "jti", "baton_conversation", "baton_turn", "baton_step"],
        clockTolerance: 30,
      }));
    } catch (err) {
      const code = err?.code ?? "";
      if (code.startsWith("ERR_JWT_") || code.startsWith("ERR_JWS_") || tokenFaults.has(code)) {
        throw new Refused(`${err.message} (${code})`);
      }
      throw new KeysUnavailable(`cannot fetch Baton's keys from ${jwksURL}: ${err.message}`);
    }
    return {
      user: payload.sub,
      conversation: payload.baton_conversation,
      turn: payload.baton_turn,
      // The same for every post of this step: its idempotency key.
      step: payload.baton_step,
    };
  };
}
