// Command chat-usechat serves the example chat page (dist/, built with npm
// run build) and forwards /v1 to a Baton API, so that the page and the API
// share one origin:
//
//	go run ./examples/chat-usechat --api http://127.0.0.1:8080 --addr 127.0.0.1:3000
//
// then open http://127.0.0.1:3000/#token=<a token from baton token create>.
package main

import (
	"errors"
	"flag"
	"fmt"
	"log"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
)

func main() {
	_, file, _, _ := runtime.Caller(0)
	addr := flag.String("addr", "127.0.0.1:3000", "address to serve the page on")
	api := flag.String("api", "http://127.0.0.1:8080", "the Baton API to forward /v1 to")
	dist := flag.String("dist", filepath.Join(filepath.Dir(file), "dist"), "the built page (npm run build)")
	flag.Parse()
	h, err := handler(*dist, *api)
	if err != nil {
		fmt.Fprintln(os.Stderr, "chat-usechat:", err)
		os.Exit(2)
	}
	log.Printf("serving %s on http://%s, /v1 forwarded to %s", *dist, *addr, *api)
	log.Fatal(http.ListenAndServe(*addr, h))
}

// handler serves dist and forwards /v1/ to the API, streaming its answers
// as they come.
func handler(dist, api string) (http.Handler, error) {
	if _, err := os.Stat(filepath.Join(dist, "app.js")); err != nil {
		return nil, errors.New("no built page in " + dist + ": run npm ci && npm run build in examples/chat-usechat")
	}
	target, err := url.Parse(api)
	if err != nil || target.Scheme == "" || target.Host == "" {
		return nil, fmt.Errorf("--api %q is not a URL such as http://127.0.0.1:8080", api)
	}
	proxy := &httputil.ReverseProxy{
		Rewrite:       func(r *httputil.ProxyRequest) { r.SetURL(target) },
		FlushInterval: -1, // server-sent events go through at once
		// An API that cannot be reached is a broken connection to the page,
		// as it would be without this proxy, not a 502: the page resumes.
		ErrorHandler: func(http.ResponseWriter, *http.Request, error) { panic(http.ErrAbortHandler) },
	}
	mux := http.NewServeMux()
	mux.Handle("/v1/", proxy)
	mux.Handle("/", http.FileServer(http.Dir(dist)))
	return mux, nil
}
