-- +goose Up
-- Attachments. A user message may carry files (images, PDFs, text): the
-- bytes leave the message before its outbox row is written, into a
-- content-addressed store per owner (the sha256 of the bytes), and the
-- message keeps references (message_files). Every write path stores them
-- through baton_send_message_for_owner, in the message's transaction, and
-- every policy is held there: bytes per file, files per message, bytes
-- per user (the quota), and the media types taken, decided by the bytes
-- themselves (their magic numbers), not by what a client declares.
--
--   files          one row per owner and sha256: the media type found in
--                  the bytes, the size, and the bytes (NULL when a store
--                  outside PostgreSQL keeps them; see schema.FileStore).
--                  Identical bytes are stored once per owner.
--   message_files  a message's files, in order, with the file name the
--                  client gave.
--   file_usage     the bytes each owner's files take. Its row is the
--                  owner's lock: a write that adds files and the cleanup
--                  that removes them both lock it first, so that the
--                  quota counts every file once and the cleanup never
--                  removes a file that a concurrent message references.
--   file_link_key  the key of the signed links to GET /v1/files/{sha256}
--                  (history for <img>, which sends no bearer token, and
--                  external agents): random, made here, read by the API
--                  and the worker, never shown.
CREATE TABLE files (
  owner_id   BIGINT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
  sha256     TEXT NOT NULL CHECK (sha256 ~ '^[0-9a-f]{64}$'),
  media_type TEXT NOT NULL,
  size       BIGINT NOT NULL CHECK (size > 0),
  data       BYTEA,
  created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
  PRIMARY KEY (owner_id, sha256)
);
-- Images and PDFs are compressed already: no second try at it.
ALTER TABLE files ALTER COLUMN data SET STORAGE EXTERNAL;

CREATE TABLE message_files (
  message_id TEXT NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
  position   INTEGER NOT NULL,
  owner_id   BIGINT NOT NULL,
  sha256     TEXT NOT NULL,
  filename   TEXT NOT NULL DEFAULT '',
  PRIMARY KEY (message_id, position),
  FOREIGN KEY (owner_id, sha256) REFERENCES files (owner_id, sha256)
);
CREATE INDEX message_files_file ON message_files (owner_id, sha256);

CREATE TABLE file_usage (
  owner_id BIGINT PRIMARY KEY REFERENCES users(id) ON DELETE CASCADE,
  bytes    BIGINT NOT NULL DEFAULT 0
);

CREATE TABLE file_link_key (
  id  INTEGER PRIMARY KEY DEFAULT 1 CHECK (id = 1),
  key BYTEA NOT NULL
);
INSERT INTO file_link_key (key) VALUES (uuid_send(gen_random_uuid()) || uuid_send(gen_random_uuid()));

-- The media type of bytes, by their magic numbers, as Go's
-- net/http.DetectContentType finds it for the types Baton takes: PNG,
-- JPEG, GIF, WebP, PDF, and text (UTF-8 without the control bytes that
-- mark binary data). Anything else is application/octet-stream. SVG and
-- HTML are text here, and are served as text/plain.
-- +goose StatementBegin
CREATE FUNCTION baton_sniff_media_type(data bytea) RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  -- Not STRICT: the planner would answer a call with NULL itself, before
  -- the check of who may execute the function.
  IF data IS NULL THEN
    RETURN NULL;
  ELSIF substring(data FROM 1 FOR 8) = '\x89504e470d0a1a0a'::bytea THEN
    RETURN 'image/png';
  ELSIF substring(data FROM 1 FOR 3) = '\xffd8ff'::bytea THEN
    RETURN 'image/jpeg';
  ELSIF substring(data FROM 1 FOR 6) IN ('\x474946383761'::bytea, '\x474946383961'::bytea) THEN
    RETURN 'image/gif';
  ELSIF substring(data FROM 1 FOR 4) = '\x52494646'::bytea AND substring(data FROM 9 FOR 6) = '\x574542505650'::bytea THEN
    RETURN 'image/webp';
  ELSIF substring(data FROM 1 FOR 5) = '\x255044462d'::bytea THEN
    RETURN 'application/pdf';
  END IF;
  -- Text: bytes PostgreSQL takes as UTF-8, without NUL, and none of the
  -- control bytes that DetectContentType takes for binary data.
  IF position('\x00'::bytea IN data) > 0 THEN
    RETURN 'application/octet-stream';
  END IF;
  BEGIN
    IF convert_from(data, 'UTF8') ~ E'[\\x01-\\x08\\x0b\\x0e-\\x1a\\x1c-\\x1f]' THEN
      RETURN 'application/octet-stream';
    END IF;
  EXCEPTION WHEN character_not_in_repertoire OR untranslatable_character THEN
    RETURN 'application/octet-stream';
  END;
  RETURN 'text/plain';
END
$$;
-- +goose StatementEnd

-- A message's files, checked before anything is written, against the
-- limits (a JSON object: max_file_bytes, max_files, media_types; absent
-- keys take the defaults of schema.FileLimits). p_files holds, per
-- file, {"filename", "media_type"} and, for a file sent before and given
-- by reference, "sha256"; p_file_data the bytes at the same place (NULL
-- for a reference). Errors (SQLSTATE, nothing written):
--   PB020 a file over max_file_bytes      PB023 a media type not taken
--   PB021 more files than max_files       PB024 declared type is not the bytes'
--   PB025 a file that is malformed        PB026 a reference to no file of the owner
-- +goose StatementBegin
CREATE FUNCTION baton_check_files(p_owner_id bigint, p_files jsonb, p_file_data bytea[], p_limits jsonb,
  OUT sha256s text[], OUT media_types text[], OUT filenames text[], OUT sizes bigint[])
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  n integer;
  max_files integer := coalesce((p_limits->>'max_files')::integer, 4);
  max_bytes bigint := coalesce((p_limits->>'max_file_bytes')::bigint, 5242880);
  allowed text[] := '{image/png,image/jpeg,image/gif,image/webp,application/pdf,text/plain}';
  f jsonb;
  data bytea;
  declared text;
  sniffed text;
  name text;
  sum text;
  stored_type text;
  stored_size bigint;
BEGIN
  sha256s := '{}'; media_types := '{}'; filenames := '{}'; sizes := '{}';
  IF p_files IS NULL OR jsonb_typeof(p_files) = 'null' THEN
    RETURN;
  END IF;
  IF jsonb_typeof(p_files) <> 'array' THEN
    RAISE EXCEPTION USING ERRCODE = 'PB025', MESSAGE = 'files must be a JSON array of files';
  END IF;
  IF p_limits ? 'media_types' THEN
    allowed := ARRAY(SELECT jsonb_array_elements_text(p_limits->'media_types'));
  END IF;
  n := jsonb_array_length(p_files);
  IF n > max_files THEN
    RAISE EXCEPTION USING ERRCODE = 'PB021',
      MESSAGE = format('the message has %s files: the limit is %s a message', n, max_files);
  END IF;
  IF coalesce(cardinality(p_file_data), 0) > n THEN
    RAISE EXCEPTION USING ERRCODE = 'PB025',
      MESSAGE = format('%s files'' bytes for %s files: give one entry of files for each', cardinality(p_file_data), n);
  END IF;
  FOR i IN 1 .. n LOOP
    f := p_files->(i - 1);
    IF jsonb_typeof(f) <> 'object' THEN
      RAISE EXCEPTION USING ERRCODE = 'PB025', MESSAGE = format('file %s is not a JSON object', i);
    END IF;
    name := coalesce(f->>'filename', '');
    IF char_length(name) > 255 THEN
      RAISE EXCEPTION USING ERRCODE = 'PB025',
        MESSAGE = format('file %s''s name is %s characters long: the limit is 255', i, char_length(name));
    END IF;
    declared := lower(btrim(split_part(coalesce(f->>'media_type', ''), ';', 1)));
    data := p_file_data[i];
    IF data IS NULL THEN
      sum := f->>'sha256';
      IF sum IS NULL OR sum !~ '^[0-9a-f]{64}$' THEN
        RAISE EXCEPTION USING ERRCODE = 'PB025',
          MESSAGE = format('file %s has no bytes and no sha256 of a file sent before: give its bytes', i);
      END IF;
      SELECT fl.media_type, fl.size INTO stored_type, stored_size
      FROM public.files fl WHERE fl.owner_id = p_owner_id AND fl.sha256 = sum;
      IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'PB026',
          MESSAGE = format('file %s names the sha256 %s, which is none of this user''s files: send its bytes', i, sum);
      END IF;
      sniffed := stored_type;
    ELSE
      IF octet_length(data) = 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'PB025', MESSAGE = format('file %s is empty', i);
      END IF;
      IF octet_length(data) > max_bytes THEN
        RAISE EXCEPTION USING ERRCODE = 'PB020',
          MESSAGE = format('file %s is %s bytes: the limit is %s bytes a file', i, octet_length(data), max_bytes);
      END IF;
      sniffed := public.baton_sniff_media_type(data);
      IF NOT (sniffed = ANY (allowed) OR split_part(sniffed, '/', 1) || '/*' = ANY (allowed)) THEN
        RAISE EXCEPTION USING ERRCODE = 'PB023',
          MESSAGE = format('file %s is %s by its bytes, which is not taken: send one of %s', i, sniffed, array_to_string(allowed, ', '));
      END IF;
      IF declared NOT IN ('', 'application/octet-stream', sniffed)
         AND NOT (sniffed = 'text/plain' AND starts_with(declared, 'text/')) THEN
        RAISE EXCEPTION USING ERRCODE = 'PB024',
          MESSAGE = format('file %s is declared %s but its bytes are %s: declare what the file is', i, declared, sniffed);
      END IF;
      sum := encode(sha256(data), 'hex');
      stored_size := octet_length(data);
    END IF;
    sha256s := sha256s || sum;
    media_types := media_types || sniffed;
    filenames := filenames || name;
    sizes := sizes || stored_size;
  END LOOP;
END
$$;
-- +goose StatementEnd

-- Stores a new message's checked files under the owner's lock: the bytes
-- once per owner and sha256, the message's references, and the owner's
-- usage, within the quota p_max_user_bytes (NULL or negative: none).
-- PB022: the quota would be exceeded; nothing is written.
-- +goose StatementBegin
CREATE FUNCTION baton_store_files(p_owner_id bigint, p_message_key text,
  sha256s text[], media_types text[], filenames text[], sizes bigint[], p_file_data bytea[], p_max_user_bytes bigint)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  used bigint;
  added bigint := 0;
  inserted text;
BEGIN
  IF cardinality(sha256s) = 0 THEN
    RETURN;
  END IF;
  INSERT INTO public.file_usage (owner_id) VALUES (p_owner_id) ON CONFLICT (owner_id) DO NOTHING;
  SELECT u.bytes INTO used FROM public.file_usage u WHERE u.owner_id = p_owner_id FOR UPDATE;
  FOR i IN 1 .. cardinality(sha256s) LOOP
    IF p_file_data[i] IS NOT NULL THEN
      INSERT INTO public.files (owner_id, sha256, media_type, size, data)
      VALUES (p_owner_id, sha256s[i], media_types[i], sizes[i], p_file_data[i])
      ON CONFLICT (owner_id, sha256) DO NOTHING
      RETURNING sha256 INTO inserted;
      IF inserted IS NOT NULL THEN
        added := added + sizes[i];
        inserted := NULL;
      END IF;
    ELSIF NOT EXISTS (SELECT FROM public.files fl WHERE fl.owner_id = p_owner_id AND fl.sha256 = sha256s[i]) THEN
      -- Removed since the check saw it: its last message went meanwhile.
      RAISE EXCEPTION USING ERRCODE = 'PB026',
        MESSAGE = format('file %s names the sha256 %s, which is none of this user''s files: send its bytes', i, sha256s[i]);
    END IF;
    INSERT INTO public.message_files (message_id, position, owner_id, sha256, filename)
    VALUES (p_message_key, i, p_owner_id, sha256s[i], filenames[i]);
  END LOOP;
  IF added > 0 THEN
    IF p_max_user_bytes >= 0 AND used + added > p_max_user_bytes THEN
      RAISE EXCEPTION USING ERRCODE = 'PB022',
        MESSAGE = format('the files would take %s bytes of this user''s %s (%s in use): delete conversations with files first',
          added, p_max_user_bytes, used);
    END IF;
    UPDATE public.file_usage SET bytes = bytes + added WHERE owner_id = p_owner_id;
  END IF;
END
$$;
-- +goose StatementEnd

-- Removes the owner's files that no message references any more, under
-- the owner's lock, and gives their bytes back to the quota. Returns the
-- number of files removed.
-- +goose StatementBegin
CREATE FUNCTION baton_release_files(p_owner_id bigint, p_candidates text[] DEFAULT NULL) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  freed bigint;
  removed integer;
BEGIN
  PERFORM FROM public.file_usage u WHERE u.owner_id = p_owner_id FOR UPDATE;
  WITH gone AS (
    DELETE FROM public.files fl
    WHERE fl.owner_id = p_owner_id AND (p_candidates IS NULL OR fl.sha256 = ANY (p_candidates))
      AND NOT EXISTS (SELECT FROM public.message_files mf WHERE mf.owner_id = fl.owner_id AND mf.sha256 = fl.sha256)
    RETURNING fl.size)
  SELECT count(*), coalesce(sum(size), 0) INTO removed, freed FROM gone;
  IF freed > 0 THEN
    UPDATE public.file_usage SET bytes = greatest(bytes - freed, 0) WHERE owner_id = p_owner_id;
  END IF;
  RETURN removed;
END
$$;
-- +goose StatementEnd

-- Prune's sweep: the files of up to p_limit owners that no message
-- references (left by a store outside PostgreSQL, or by anything that
-- removed references without the trigger below), released owner by
-- owner. Returns the number of files removed.
-- +goose StatementBegin
CREATE FUNCTION baton_prune_files(p_limit integer) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  o bigint;
  removed integer := 0;
BEGIN
  FOR o IN
    SELECT DISTINCT fl.owner_id FROM public.files fl
    WHERE NOT EXISTS (SELECT FROM public.message_files mf WHERE mf.owner_id = fl.owner_id AND mf.sha256 = fl.sha256)
    ORDER BY fl.owner_id LIMIT p_limit
  LOOP
    removed := removed + public.baton_release_files(o);
  END LOOP;
  RETURN removed;
END
$$;
-- +goose StatementEnd

-- Whatever removes a message's references (a conversation deleted, a
-- user deleted) removes the files that no other message references.
-- +goose StatementBegin
CREATE FUNCTION baton_message_files_released() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  o record;
BEGIN
  -- Owners in order, so that two deletes never wait on each other.
  FOR o IN SELECT g.owner_id, array_agg(DISTINCT g.sha256) AS sums FROM gone g GROUP BY g.owner_id ORDER BY g.owner_id LOOP
    PERFORM public.baton_release_files(o.owner_id, o.sums);
  END LOOP;
  RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER message_files_released AFTER DELETE ON message_files
  REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION baton_message_files_released();

DROP FUNCTION baton_send_message(text, text, text, text);
DROP FUNCTION baton_send_message_for_owner(bigint, text, text, text, text);

-- The write path of a user message, as in 00023, with its files: checked
-- first (nothing is written when one is refused), stored after the
-- message and before its outbox row. A message may have no text when it
-- has files. A retry must name the same files, in the same order.
-- +goose StatementBegin
CREATE FUNCTION baton_send_message_for_owner(
  p_owner_id bigint, p_conversation_id text, p_message_id text, p_content text, p_trace_parent text,
  p_files jsonb DEFAULT NULL, p_file_data bytea[] DEFAULT NULL, p_file_limits jsonb DEFAULT NULL,
  OUT conversation_key text, OUT message_key text, OUT outbox_id bigint, OUT message_seq bigint,
  OUT message_created_at timestamptz, OUT outbox_status text, OUT existed boolean, OUT interrupted_run_id text,
  OUT file_sha256s text[], OUT file_media_types text[], OUT file_sizes bigint[])
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  stored_conversation text;
  stored_content text;
  stored_files text[];
  policy text;
  running text;
  stopping text;
  interrupting text;
  parked bigint;
  approval_public text;
  approval_turn text;
  approval_operation bigint;
  checked record;
BEGIN
  PERFORM public.baton_check_id('conversation', p_conversation_id);
  PERFORM public.baton_check_id('message', p_message_id);
  checked := public.baton_check_files(p_owner_id, p_files, p_file_data, p_file_limits);
  file_sha256s := checked.sha256s;
  file_media_types := checked.media_types;
  file_sizes := checked.sizes;
  IF (p_content IS NULL OR p_content = '') AND cardinality(checked.sha256s) = 0 THEN
    RAISE EXCEPTION USING ERRCODE = 'PB004', MESSAGE = 'content is empty: give the text of the message, or files';
  END IF;
  IF octet_length(p_content) > 1048576 THEN
    RAISE EXCEPTION USING ERRCODE = 'PB005',
      MESSAGE = format('content is %s bytes: the limit is 1048576 bytes (1 MiB)', octet_length(p_content));
  END IF;

  SELECT c.id, c.double_texting, c.run_id, c.stop_run_id, c.interrupted_run_id, c.approval_id
  INTO conversation_key, policy, running, stopping, interrupting, parked
  FROM public.conversations c
  WHERE c.owner_id = p_owner_id AND c.public_id = p_conversation_id
  FOR NO KEY UPDATE;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'PB010',
      MESSAGE = format('no conversation "%s" for this user: create it first with baton_create_conversation (conversation ids are per user)', p_conversation_id);
  END IF;

  IF policy = 'reject'
     AND (running IS NOT NULL OR EXISTS (SELECT FROM public.agent_outbox o
                                         WHERE o.conversation_id = conversation_key AND o.status IN ('pending', 'processing')))
     AND NOT EXISTS (SELECT FROM public.messages m WHERE m.owner_id = p_owner_id AND m.public_id = p_message_id) THEN
    IF running IS NULL AND parked IS NOT NULL THEN
      SELECT a.public_id INTO approval_public FROM public.approvals a WHERE a.id = parked AND a.status = 'pending';
    END IF;
    IF approval_public IS NOT NULL THEN
      RAISE EXCEPTION USING ERRCODE = 'PB012',
        MESSAGE = format('conversation "%s" waits for the approval "%s" of its turn, and its double texting is reject: decide the approval or stop the turn, then send the message', p_conversation_id, approval_public);
    END IF;
    RAISE EXCEPTION USING ERRCODE = 'PB012',
      MESSAGE = format('conversation "%s" has a turn running, and its double texting is reject: send the message once its reply is in, or stop the turn first', p_conversation_id);
  END IF;

  INSERT INTO public.messages AS m (id, public_id, owner_id, conversation_id, role, content)
  VALUES (public.baton_new_key('m_'), p_message_id, p_owner_id, conversation_key, 'user', coalesce(p_content, ''))
  ON CONFLICT (owner_id, public_id) WHERE public_id IS NOT NULL DO NOTHING
  RETURNING m.id, m.seq, m.created_at INTO message_key, message_seq, message_created_at;
  IF FOUND THEN
    -- The bytes leave the message here, before its outbox row.
    PERFORM public.baton_store_files(p_owner_id, message_key, checked.sha256s, checked.media_types, checked.filenames, checked.sizes, p_file_data,
      coalesce((p_file_limits->>'max_user_bytes')::bigint, 1073741824));

    INSERT INTO public.agent_outbox AS o (conversation_id, message_id, trace_parent)
    VALUES (conversation_key, message_key, nullif(p_trace_parent, ''))
    RETURNING o.id INTO outbox_id;

    IF policy = 'interrupt' AND running IS NOT NULL THEN
      IF stopping IS DISTINCT FROM running THEN
        UPDATE public.conversations SET stop_run_id = running, interrupted_run_id = running WHERE id = conversation_key;
        interrupted_run_id := running;
      ELSIF interrupting = running THEN
        interrupted_run_id := running;
      END IF;
    ELSIF policy = 'interrupt' AND parked IS NOT NULL THEN
      SELECT a.turn_id, a.operation_id INTO approval_turn, approval_operation
      FROM public.approvals a WHERE a.id = parked FOR UPDATE OF a;
      IF FOUND THEN
        UPDATE public.approvals SET status = 'denied', decided_at = now(), decided_by = p_owner_id
        WHERE id = parked AND status = 'pending';
        UPDATE public.operations SET status = 'denied', error = 'not sent: a newer message interrupted the turn', finished_at = now()
        WHERE id = approval_operation AND status = 'awaiting_approval';
        IF EXISTS (SELECT FROM public.operations p
                   WHERE p.conversation_id = conversation_key AND p.turn_id = approval_turn AND p.effect = 'write'
                     AND p.status NOT IN ('awaiting_approval', 'denied')) THEN
          UPDATE public.agent_outbox SET status = 'done', processed_at = now(), stopped_at = now()
          WHERE conversation_id = conversation_key AND status = 'pending' AND id <> outbox_id;
        ELSE
          UPDATE public.agent_outbox SET steps_turn_id = NULL
          WHERE conversation_id = conversation_key AND status = 'pending' AND id <> outbox_id AND steps_turn_id IS NOT NULL;
        END IF;
      END IF;
      UPDATE public.conversations SET approval_id = NULL WHERE id = conversation_key;
    END IF;

    UPDATE public.conversations SET updated_at = now(), last_message_at = now() WHERE id = conversation_key;
    outbox_status := 'pending';
    existed := false;
    RETURN;
  END IF;

  -- The owner has a message of this id: a retry, or a conflict.
  SELECT m.id, m.conversation_id, c.public_id, m.content, m.seq, m.created_at, o.id, o.status,
    ARRAY(SELECT mf.sha256 FROM public.message_files mf WHERE mf.message_id = m.id ORDER BY mf.position)
  INTO message_key, conversation_key, stored_conversation, stored_content, message_seq, message_created_at, outbox_id, outbox_status, stored_files
  FROM public.messages m JOIN public.conversations c ON c.id = m.conversation_id
  LEFT JOIN public.agent_outbox o ON o.message_id = m.id
  WHERE m.owner_id = p_owner_id AND m.public_id = p_message_id;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'PB010',
      MESSAGE = format('no conversation "%s" for this user: it was deleted', p_conversation_id);
  END IF;
  IF stored_conversation <> p_conversation_id THEN
    RAISE EXCEPTION USING ERRCODE = 'PB011',
      MESSAGE = format('message id "%s" was already used in conversation "%s": use a new id for a new message', p_message_id, stored_conversation);
  END IF;
  IF stored_content <> coalesce(p_content, '') OR stored_files <> checked.sha256s THEN
    RAISE EXCEPTION USING ERRCODE = 'PB011',
      MESSAGE = format('message id "%s" was already used for different content: use a new id for a new message', p_message_id);
  END IF;
  existed := true;
END
$$;
-- +goose StatementEnd

-- The stable contract gains an optional fifth argument, the message's
-- files: a JSON array of {"filename", "media_type", "data"} (the bytes
-- in base64) or {"filename", "url"} with a data URL
-- ("data:image/png;base64,..."), as the AI SDK's file parts carry them.
-- The defaults of schema.FileLimits apply.
-- +goose StatementBegin
CREATE FUNCTION baton_send_message(user_id text, conversation_id text, message_id text, content text, files jsonb DEFAULT NULL,
  OUT message_key text, OUT existed boolean)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  sent record;
  meta jsonb := '[]';
  data bytea[] := '{}';
  f jsonb;
  url text;
  header text;
  body text;
  declared text;
BEGIN
  IF files IS NOT NULL AND jsonb_typeof(files) <> 'null' THEN
    IF jsonb_typeof(files) <> 'array' THEN
      RAISE EXCEPTION USING ERRCODE = 'PB025', MESSAGE = 'files must be a JSON array of files';
    END IF;
    FOR i IN 0 .. jsonb_array_length(files) - 1 LOOP
      f := files->i;
      IF jsonb_typeof(f) <> 'object' THEN
        RAISE EXCEPTION USING ERRCODE = 'PB025', MESSAGE = format('file %s is not a JSON object', i + 1);
      END IF;
      declared := f->>'media_type';
      IF f ? 'url' THEN
        url := f->>'url';
        IF url IS NULL OR NOT starts_with(url, 'data:') OR position(',' IN url) = 0 THEN
          RAISE EXCEPTION USING ERRCODE = 'PB025',
            MESSAGE = format('file %s''s url is not a data URL: give "data:<media type>;base64,<bytes>" (URLs are never fetched)', i + 1);
        END IF;
        header := substring(url FROM 6 FOR position(',' IN url) - 6);
        body := substring(url FROM position(',' IN url) + 1);
        IF NOT header ~ ';base64$' THEN
          RAISE EXCEPTION USING ERRCODE = 'PB025', MESSAGE = format('file %s''s data URL is not base64', i + 1);
        END IF;
        declared := coalesce(declared, nullif(split_part(header, ';', 1), ''));
      ELSE
        body := f->>'data';
        IF body IS NULL THEN
          RAISE EXCEPTION USING ERRCODE = 'PB025', MESSAGE = format('file %s has neither "data" nor "url"', i + 1);
        END IF;
      END IF;
      BEGIN
        data := data || decode(body, 'base64');
      EXCEPTION WHEN invalid_parameter_value THEN
        RAISE EXCEPTION USING ERRCODE = 'PB025', MESSAGE = format('file %s''s bytes are not base64', i + 1);
      END;
      meta := meta || jsonb_build_array(jsonb_build_object('filename', coalesce(f->>'filename', ''), 'media_type', coalesce(declared, '')));
    END LOOP;
  END IF;
  -- A user Baton does not know has no conversation: the answer is PB010,
  -- and no user is made.
  sent := public.baton_send_message_for_owner(public.baton_producer_user(user_id, false), conversation_id, message_id, content, NULL,
    meta, data, NULL);
  message_key := sent.message_key;
  existed := sent.existed;
END
$$;
-- +goose StatementEnd

INSERT INTO baton_grants (object, role, privilege, columns, reason) VALUES
  ('files', 'baton_api', 'SELECT', NULL, 'GET /v1/files/{sha256} serves a file; InsertMessageTx checks a reference'),
  ('files', 'baton_api', 'INSERT', NULL, 'InsertMessageTx stores a message''s files'),
  ('files', 'baton_worker', 'SELECT', NULL, 'the model loop sends a turn''s files'),
  ('message_files', 'baton_api', 'SELECT', NULL, 'histories list a message''s files'),
  ('message_files', 'baton_api', 'INSERT', NULL, 'InsertMessageTx references a message''s files'),
  ('message_files', 'baton_worker', 'SELECT', NULL, 'LoadTurn reads a turn''s files'),
  ('file_usage', 'baton_api', 'SELECT', NULL, 'InsertMessageTx locks the owner''s usage and checks the quota'),
  ('file_usage', 'baton_api', 'INSERT', NULL, 'InsertMessageTx makes the owner''s usage row'),
  ('file_usage', 'baton_api', 'UPDATE', '{bytes}', 'InsertMessageTx counts the bytes of new files'),
  ('file_link_key', 'baton_api', 'SELECT', NULL, 'the API signs and checks the links to GET /v1/files/{sha256}'),
  ('file_link_key', 'baton_worker', 'SELECT', NULL, 'the worker signs links to files for external agents'),
  ('baton_sniff_media_type', 'baton_api', 'EXECUTE', NULL, 'InsertMessageTx finds a file''s media type in its bytes'),
  ('baton_check_files', 'baton_api', 'EXECUTE', NULL, 'InsertMessageTx checks a message''s files'),
  ('baton_store_files', 'baton_api', 'EXECUTE', NULL, 'InsertMessageTx stores a message''s files'),
  ('baton_release_files', 'baton_migrator', 'NONE', NULL, 'called by the trigger of message_files and baton_prune_files, as their owner'),
  ('baton_prune_files', 'baton_relay', 'EXECUTE', NULL, 'Prune removes files no message references'),
  ('baton_message_files_released', 'baton_migrator', 'NONE', NULL, 'the trigger of message_files; a trigger needs no EXECUTE to fire');
SELECT baton_apply_grants();

-- +goose Down
DELETE FROM baton_grants WHERE object IN ('files', 'message_files', 'file_usage', 'file_link_key', 'baton_sniff_media_type',
  'baton_check_files', 'baton_store_files', 'baton_release_files', 'baton_prune_files', 'baton_message_files_released');
DROP FUNCTION baton_send_message(text, text, text, text, jsonb);
DROP FUNCTION baton_send_message_for_owner(bigint, text, text, text, text, jsonb, bytea[], jsonb);
DROP TRIGGER message_files_released ON message_files;
DROP FUNCTION baton_message_files_released();
DROP FUNCTION baton_prune_files(integer);
DROP FUNCTION baton_release_files(bigint, text[]);
DROP FUNCTION baton_store_files(bigint, text, text[], text[], text[], bigint[], bytea[], bigint);
DROP FUNCTION baton_check_files(bigint, jsonb, bytea[], jsonb);
DROP FUNCTION baton_sniff_media_type(bytea);
DROP TABLE file_link_key, file_usage, message_files, files;
-- The write path of 00023 and the SQL producer's function of 00015.
-- +goose StatementBegin
CREATE FUNCTION baton_send_message_for_owner(
  p_owner_id bigint, p_conversation_id text, p_message_id text, p_content text, p_trace_parent text,
  OUT conversation_key text, OUT message_key text, OUT outbox_id bigint, OUT message_seq bigint,
  OUT message_created_at timestamptz, OUT outbox_status text, OUT existed boolean, OUT interrupted_run_id text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  stored_conversation text;
  stored_content text;
  policy text;
  running text;
  stopping text;
  interrupting text;
  parked bigint;
  approval_public text;
  approval_turn text;
  approval_operation bigint;
BEGIN
  PERFORM public.baton_check_id('conversation', p_conversation_id);
  PERFORM public.baton_check_id('message', p_message_id);
  IF p_content IS NULL OR p_content = '' THEN
    RAISE EXCEPTION USING ERRCODE = 'PB004', MESSAGE = 'content is empty: give the text of the message';
  END IF;
  IF octet_length(p_content) > 1048576 THEN
    RAISE EXCEPTION USING ERRCODE = 'PB005',
      MESSAGE = format('content is %s bytes: the limit is 1048576 bytes (1 MiB)', octet_length(p_content));
  END IF;

  SELECT c.id, c.double_texting, c.run_id, c.stop_run_id, c.interrupted_run_id, c.approval_id
  INTO conversation_key, policy, running, stopping, interrupting, parked
  FROM public.conversations c
  WHERE c.owner_id = p_owner_id AND c.public_id = p_conversation_id
  FOR NO KEY UPDATE;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'PB010',
      MESSAGE = format('no conversation "%s" for this user: create it first with baton_create_conversation (conversation ids are per user)', p_conversation_id);
  END IF;

  -- reject: while a turn runs, or a message waits for one (a turn that
  -- waits for an approval has its messages pending), a new message is
  -- refused. A retry of a message stored before is answered as always.
  IF policy = 'reject'
     AND (running IS NOT NULL OR EXISTS (SELECT FROM public.agent_outbox o
                                         WHERE o.conversation_id = conversation_key AND o.status IN ('pending', 'processing')))
     AND NOT EXISTS (SELECT FROM public.messages m WHERE m.owner_id = p_owner_id AND m.public_id = p_message_id) THEN
    IF running IS NULL AND parked IS NOT NULL THEN
      SELECT a.public_id INTO approval_public FROM public.approvals a WHERE a.id = parked AND a.status = 'pending';
    END IF;
    IF approval_public IS NOT NULL THEN
      RAISE EXCEPTION USING ERRCODE = 'PB012',
        MESSAGE = format('conversation "%s" waits for the approval "%s" of its turn, and its double texting is reject: decide the approval or stop the turn, then send the message', p_conversation_id, approval_public);
    END IF;
    RAISE EXCEPTION USING ERRCODE = 'PB012',
      MESSAGE = format('conversation "%s" has a turn running, and its double texting is reject: send the message once its reply is in, or stop the turn first', p_conversation_id);
  END IF;

  INSERT INTO public.messages AS m (id, public_id, owner_id, conversation_id, role, content)
  VALUES (public.baton_new_key('m_'), p_message_id, p_owner_id, conversation_key, 'user', p_content)
  ON CONFLICT (owner_id, public_id) WHERE public_id IS NOT NULL DO NOTHING
  RETURNING m.id, m.seq, m.created_at INTO message_key, message_seq, message_created_at;
  IF FOUND THEN
    INSERT INTO public.agent_outbox AS o (conversation_id, message_id, trace_parent)
    VALUES (conversation_key, message_key, nullif(p_trace_parent, ''))
    RETURNING o.id INTO outbox_id;

    IF policy = 'interrupt' AND running IS NOT NULL THEN
      -- The running turn is asked to stop as a stop asks it; a run a
      -- user stopped stays stopped, and its messages are not answered
      -- again. A run interrupted before is named again: telling its
      -- worker twice does no harm.
      IF stopping IS DISTINCT FROM running THEN
        UPDATE public.conversations SET stop_run_id = running, interrupted_run_id = running WHERE id = conversation_key;
        interrupted_run_id := running;
      ELSIF interrupting = running THEN
        interrupted_run_id := running;
      END IF;
    ELSIF policy = 'interrupt' AND parked IS NOT NULL THEN
      -- The turn waits for an approval, or to resume from one, and holds
      -- no run: its call is never sent (a pending approval is denied, as
      -- a stop denies it), and its messages wait again for a turn, which
      -- answers them with this one. A turn that ran a write before the
      -- call is never answered again (the write could be repeated): its
      -- messages are settled, as a stop settles them.
      SELECT a.turn_id, a.operation_id INTO approval_turn, approval_operation
      FROM public.approvals a WHERE a.id = parked FOR UPDATE OF a;
      IF FOUND THEN
        UPDATE public.approvals SET status = 'denied', decided_at = now(), decided_by = p_owner_id
        WHERE id = parked AND status = 'pending';
        UPDATE public.operations SET status = 'denied', error = 'not sent: a newer message interrupted the turn', finished_at = now()
        WHERE id = approval_operation AND status = 'awaiting_approval';
        IF EXISTS (SELECT FROM public.operations p
                   WHERE p.conversation_id = conversation_key AND p.turn_id = approval_turn AND p.effect = 'write'
                     AND p.status NOT IN ('awaiting_approval', 'denied')) THEN
          UPDATE public.agent_outbox SET status = 'done', processed_at = now(), stopped_at = now()
          WHERE conversation_id = conversation_key AND status = 'pending' AND id <> outbox_id;
        ELSE
          UPDATE public.agent_outbox SET steps_turn_id = NULL
          WHERE conversation_id = conversation_key AND status = 'pending' AND id <> outbox_id AND steps_turn_id IS NOT NULL;
        END IF;
      END IF;
      UPDATE public.conversations SET approval_id = NULL WHERE id = conversation_key;
    END IF;

    UPDATE public.conversations SET updated_at = now(), last_message_at = now() WHERE id = conversation_key;
    outbox_status := 'pending';
    existed := false;
    RETURN;
  END IF;

  -- The owner has a message of this id: a retry, or a conflict.
  SELECT m.id, m.conversation_id, c.public_id, m.content, m.seq, m.created_at, o.id, o.status
  INTO message_key, conversation_key, stored_conversation, stored_content, message_seq, message_created_at, outbox_id, outbox_status
  FROM public.messages m JOIN public.conversations c ON c.id = m.conversation_id
  LEFT JOIN public.agent_outbox o ON o.message_id = m.id
  WHERE m.owner_id = p_owner_id AND m.public_id = p_message_id;
  IF NOT FOUND THEN
    -- Deleted with its conversation since the insert found it.
    RAISE EXCEPTION USING ERRCODE = 'PB010',
      MESSAGE = format('no conversation "%s" for this user: it was deleted', p_conversation_id);
  END IF;
  IF stored_conversation <> p_conversation_id THEN
    RAISE EXCEPTION USING ERRCODE = 'PB011',
      MESSAGE = format('message id "%s" was already used in conversation "%s": use a new id for a new message', p_message_id, stored_conversation);
  END IF;
  IF stored_content <> p_content THEN
    RAISE EXCEPTION USING ERRCODE = 'PB011',
      MESSAGE = format('message id "%s" was already used for different content: use a new id for a new message', p_message_id);
  END IF;
  existed := true;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION baton_send_message(user_id text, conversation_id text, message_id text, content text,
  OUT message_key text, OUT existed boolean)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  sent record;
BEGIN
  -- A user Baton does not know has no conversation: the answer is PB010,
  -- and no user is made. (An assignment, not a SELECT: PostgreSQL calls the
  -- function directly rather than through a query.)
  sent := public.baton_send_message_for_owner(public.baton_producer_user(user_id, false), conversation_id, message_id, content, NULL);
  message_key := sent.message_key;
  existed := sent.existed;
END
$$;
-- +goose StatementEnd

SELECT baton_apply_grants();
