-- +goose Up
-- Two more rules for the ids clients choose, held by every write path
-- (schema.ValidateID holds the API and the Go producer to the same):
--   "." and ".." are refused: URLs drop such a path segment, so that a
--   conversation of that id could be written and never read (PB002, PB003);
--   a message id may not start with "reply_" or "error_", the prefixes of
--   the ids the server gives its replies and visible errors, so that no two
--   messages of a conversation ever show one id (PB013).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION baton_check_id(kind text, id text) RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  code text := CASE kind WHEN 'conversation' THEN 'PB002' ELSE 'PB003' END;
  bad text;
BEGIN
  IF id IS NULL OR id = '' THEN
    RAISE EXCEPTION USING ERRCODE = code, MESSAGE = format('%s id is empty: give 1 to 200 characters', kind);
  END IF;
  IF char_length(id) > 200 THEN
    RAISE EXCEPTION USING ERRCODE = code,
      MESSAGE = format('%s id is %s characters long: the limit is 200', kind, char_length(id));
  END IF;
  bad := substring(id FROM E'[\\u0001-\\u001f\\u007f-\\u009f]');
  IF bad IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = code,
      MESSAGE = format('%s id contains the control character U+%s: use printable characters only', kind, lpad(upper(to_hex(ascii(bad))), 4, '0'));
  END IF;
  IF id ~ E'^[ \\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]'
     OR id ~ E'[ \\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]$' THEN
    RAISE EXCEPTION USING ERRCODE = code, MESSAGE = format('%s id "%s" starts or ends with whitespace: remove it', kind, id);
  END IF;
  IF id IN ('.', '..') THEN
    RAISE EXCEPTION USING ERRCODE = code,
      MESSAGE = format('%s id "%s" cannot be a part of a URL''s path (URLs drop it): choose another', kind, id);
  END IF;
  IF kind = 'message' AND (starts_with(id, 'reply_') OR starts_with(id, 'error_')) THEN
    RAISE EXCEPTION USING ERRCODE = 'PB013',
      MESSAGE = format('message id "%s" starts with "%s", which only the server''s replies and errors use: choose another id', id, left(id, 6));
  END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION baton_check_id(kind text, id text) RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  code text := CASE kind WHEN 'conversation' THEN 'PB002' ELSE 'PB003' END;
  bad text;
BEGIN
  IF id IS NULL OR id = '' THEN
    RAISE EXCEPTION USING ERRCODE = code, MESSAGE = format('%s id is empty: give 1 to 200 characters', kind);
  END IF;
  IF char_length(id) > 200 THEN
    RAISE EXCEPTION USING ERRCODE = code,
      MESSAGE = format('%s id is %s characters long: the limit is 200', kind, char_length(id));
  END IF;
  bad := substring(id FROM E'[\\u0001-\\u001f\\u007f-\\u009f]');
  IF bad IS NOT NULL THEN
    RAISE EXCEPTION USING ERRCODE = code,
      MESSAGE = format('%s id contains the control character U+%s: use printable characters only', kind, lpad(upper(to_hex(ascii(bad))), 4, '0'));
  END IF;
  IF id ~ E'^[ \\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]'
     OR id ~ E'[ \\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]$' THEN
    RAISE EXCEPTION USING ERRCODE = code, MESSAGE = format('%s id "%s" starts or ends with whitespace: remove it', kind, id);
  END IF;
END
$$;
-- +goose StatementEnd
