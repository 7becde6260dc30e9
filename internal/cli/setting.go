package cli

import (
	"errors"
	"fmt"
	"reflect"
	"strings"

	"github.com/batonhq/baton/internal/setting"
)

// settingError turns a library configuration's *setting.Error into a usage
// error that names the flag and the variable behind the field: cmd's field
// whose `setting` tag is the error's Field (embedded structs included).
// Other errors come back as usage errors unchanged.
func settingError(cmd any, err error) error {
	if err == nil {
		return nil
	}
	var se *setting.Error
	if !errors.As(err, &se) {
		return &UsageError{Err: err}
	}
	if flag, env, ok := flagOf(reflect.ValueOf(cmd), se.Field); ok {
		return &UsageError{Err: fmt.Errorf("--%s / %s %v: %s", flag, env, se.Value, se.Problem)}
	}
	return &UsageError{Err: err}
}

// flagOf finds the flag and variable of the field tagged `setting:"field"`.
func flagOf(v reflect.Value, field string) (flag, env string, ok bool) {
	for v.Kind() == reflect.Pointer || v.Kind() == reflect.Interface {
		if v.IsNil() {
			return "", "", false
		}
		v = v.Elem()
	}
	if v.Kind() != reflect.Struct {
		return "", "", false
	}
	t := v.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		for _, s := range strings.Split(f.Tag.Get("setting"), ",") {
			if s != "" && s == field {
				return f.Tag.Get("name"), f.Tag.Get("env"), true
			}
		}
		if f.Type.Kind() == reflect.Struct && (f.Anonymous || f.Tag.Get("embed") != "") {
			if flag, env, ok := flagOf(v.Field(i), field); ok {
				return flag, env, true
			}
		}
	}
	return "", "", false
}
