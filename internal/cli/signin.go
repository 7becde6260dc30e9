package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/rs/zerolog"

	"github.com/batonhq/baton/api"
	"github.com/batonhq/baton/internal/status"
	"github.com/batonhq/baton/jwtauth"
)

// jwtFlags say whose JSON Web Tokens the API accepts beside Baton's own
// tokens: `baton api` and `baton dev` accept them, `baton status` shows
// them and checks that the provider's keys can be had. A flag left out
// means the library's default.
type jwtFlags struct {
	JWTIssuer          string `name:"jwt-issuer" env:"BATON_JWT_ISSUER" setting:"JWT.Issuer" placeholder:"URL" help:"Accept the access tokens of this OpenID Connect issuer, exactly as their iss says it (Auth0's ends with a slash); its keys are found by discovery. Needs --jwt-audience. Default: none."`
	JWTJWKSURL         string `name:"jwt-jwks-url" env:"BATON_JWT_JWKS_URL" setting:"JWT.JWKSURL" placeholder:"URL" help:"Take the issuer's keys from this JWKS instead of discovery; --jwt-issuer is still required. Default: the discovered jwks_uri."`
	JWTAudience        string `name:"jwt-audience" env:"BATON_JWT_AUDIENCE" setting:"JWT.Audience" help:"The aud every JWT must carry (the API identifier of Auth0, the client id of Keycloak). Required when JWTs are accepted."`
	JWTHS256SecretFile string `name:"jwt-hs256-secret-file" env:"BATON_JWT_HS256_SECRET_FILE" setting:"JWT.HS256Secret" type:"path" placeholder:"PATH" help:"Accept HS256 tokens a backend mints with the secret in this file (at least 32 bytes; a trailing newline is not part of it). Needs --jwt-hs256-issuer. Default: none."`
	JWTHS256Issuer     string `name:"jwt-hs256-issuer" env:"BATON_JWT_HS256_ISSUER" setting:"JWT.HS256Issuer" help:"The iss every HS256 token must carry, such as https://app.example/; it keeps the backend's users apart from the provider's. Required with --jwt-hs256-secret-file."`
	JWTUserClaim       string `name:"jwt-user-claim" env:"BATON_JWT_USER_CLAIM" setting:"JWT.UserClaim" help:"The claim that names the user after the issuer: the user is <iss>|<claim>. Defaults to ${jwt_user_claim}."`
	JWTAllowHTTP       bool   `name:"jwt-allow-http" env:"BATON_JWT_ALLOW_HTTP" help:"Let the issuer and its keys be reached over plain HTTP, for development only: anyone on the path could swap the keys."`
}

// jwtConfig returns the verifier's configuration, with the HS256 secret
// read from its file. No error repeats the secret.
func (f jwtFlags) jwtConfig() (jwtauth.Config, error) {
	cfg := jwtauth.Config{
		Issuer: f.JWTIssuer, JWKSURL: f.JWTJWKSURL, Audience: f.JWTAudience,
		HS256Issuer: f.JWTHS256Issuer, UserClaim: f.JWTUserClaim, AllowHTTP: f.JWTAllowHTTP,
	}
	if f.JWTHS256SecretFile != "" {
		secret, err := readSecretFile(f.JWTHS256SecretFile)
		if err != nil {
			return cfg, &UsageError{Err: fmt.Errorf("--jwt-hs256-secret-file / BATON_JWT_HS256_SECRET_FILE: %w", err)}
		}
		cfg.HS256Secret = secret
	}
	return cfg, nil
}

// readSecretFile reads a secret from path: at most maxSecretFile bytes,
// without the trailing newline an editor adds. Its errors name the file,
// never its content.
func readSecretFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("cannot read the secret file: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxSecretFile+1))
	if err != nil {
		return nil, fmt.Errorf("cannot read the secret file %s: %w", path, err)
	}
	if len(b) > maxSecretFile {
		return nil, fmt.Errorf("%s is over %d bytes: it should hold only the secret", path, maxSecretFile)
	}
	b = []byte(strings.TrimRight(string(b), "\r\n"))
	if len(b) == 0 {
		return nil, fmt.Errorf("%s is empty", path)
	}
	return b, nil
}

// apiSignIn sets the JWT and CORS settings of cfg from the flags and
// checks them, naming the flag of a value that cannot work.
func apiSignIn(cmd any, f jwtFlags, origins []string, cfg api.Config, log zerolog.Logger) (api.Config, error) {
	jwt, err := f.jwtConfig()
	if err != nil {
		return cfg, err
	}
	jwt.Logger = &log
	cfg.JWT, cfg.CORSOrigins = jwt, origins
	if err := cfg.WithDefaults().Validate(); err != nil {
		return cfg, settingError(cmd, err)
	}
	return cfg, nil
}

// logSignIn says at start which tokens the API accepts and from where it
// takes the keys, and fetches them once so that the log says whether they
// can be had. It never logs the secret.
func logSignIn(ctx context.Context, srv *api.Server, origins []string, log zerolog.Logger) {
	if len(origins) > 0 {
		log.Info().Strs("origins", origins).Msg("browsers on these origins may call the API (CORS)")
	}
	v := srv.JWT()
	if v == nil {
		log.Info().Msg("sign-in: Baton tokens only")
		return
	}
	s := signInStatus(ctx, v)
	ev := log.Info()
	if s.JWT.Error != "" {
		ev = log.Warn().Str("error", s.JWT.Error)
	}
	ev = ev.Str("audience", s.JWT.Audience).Str("user_claim", s.JWT.UserClaim)
	if s.JWT.Issuer != "" {
		ev = ev.Str("issuer", s.JWT.Issuer).Str("key_source", s.JWT.KeySource).Int("keys", s.JWT.Keys)
	}
	if s.JWT.HS256Issuer != "" {
		ev = ev.Str("hs256_issuer", s.JWT.HS256Issuer)
	}
	if s.JWT.Error != "" {
		ev.Msg("sign-in: Baton tokens and JWTs; the issuer's keys cannot be fetched yet, so its tokens are refused until they can")
		return
	}
	ev.Msg("sign-in: Baton tokens and JWTs")
}

// signInStatus fetches the issuer's keys (unless fetched moments ago) and
// says what the verifier uses.
func signInStatus(ctx context.Context, v *jwtauth.Verifier) status.SignIn {
	cfg := v.Config()
	s := status.SignIn{BatonTokens: true, JWT: &status.JWTSignIn{
		Issuer: cfg.Issuer, Audience: cfg.Audience, UserClaim: cfg.UserClaim, HS256Issuer: cfg.HS256Issuer,
	}}
	if cfg.Issuer != "" {
		ks := v.Fetch(ctx)
		s.JWT.KeySource, s.JWT.JWKSURL, s.JWT.Keys = cfg.KeySource(), ks.JWKSURL, ks.Keys
		if ks.Err != nil {
			s.JWT.Error = ks.Err.Error()
		}
	}
	return s
}
