package console

// Route is a route of the console and who may reach it: "public",
// "operator" (any signed-in operator) or "admin".
type Route struct {
	Pattern, Access string
}

// Routes lists every route the console serves.
func (s *Server) Routes() []Route {
	names := map[access]string{accessPublic: "public", accessOperator: "operator", accessAdmin: "admin"}
	var out []Route
	for _, rt := range s.routeTable() {
		out = append(out, Route{Pattern: rt.pattern, Access: names[rt.access]})
	}
	return out
}
