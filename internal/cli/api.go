package cli

import "errors"

type apiCmd struct{}

func (apiCmd) Run() error { return errors.New("baton api is not built yet") }
