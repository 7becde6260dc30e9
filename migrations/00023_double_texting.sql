-- +goose Up
-- Double texting: what a conversation does with a user message that
-- arrives while a turn of it runs (claimed, streaming, or waiting for an
-- approval). The policy is the conversation's, on its row, so that every
-- write path (the API, the Go producer, the SQL producer) applies the same
-- one, in the transaction that stores the message:
--
--   enqueue    the message waits: the claim takes one message at a time
--              for such a conversation, so each gets a turn and a reply of
--              its own, in order, and the running turn is never replaced;
--   reject     the message is refused (PB012) while a turn runs or
--              waits: nothing is written;
--   interrupt  the running turn is asked to stop, as a user's stop asks
--              it, and the message is stored: the turn ends with what it
--              had written, marked stopped, and its messages are answered
--              again together with the new one (unless it started a
--              write: then it ends as a stop ends it, and the new message
--              is answered alone). A turn that waits for an approval has
--              its approval denied and its call never sent;
--   debounce   the worker's quiet window decides: a message within it
--              replaces the running turn unless that turn started a
--              write. Every conversation behaved so before this column.
--
-- The API gives the policy at creation (its own --double-texting unless
-- the request names one); baton_create_conversation takes it as an
-- optional fourth argument, and a conversation made without one gets the
-- column's default.
ALTER TABLE conversations
  ADD COLUMN double_texting TEXT NOT NULL DEFAULT 'debounce'
    CHECK (double_texting IN ('enqueue', 'reject', 'interrupt', 'debounce')),
  -- The run that a newer message interrupted: it is asked to stop as well
  -- (stop_run_id), and its finalize puts its turn's messages back to be
  -- answered with the newer ones instead of settling them. A user's stop
  -- clears it: a stopped turn is never answered again.
  ADD COLUMN interrupted_run_id TEXT;

-- A policy given to the producer functions: NULL is the column's default.
-- +goose StatementBegin
CREATE FUNCTION baton_check_double_texting(policy text) RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  IF policy IS NOT NULL AND policy NOT IN ('enqueue', 'reject', 'interrupt', 'debounce') THEN
    RAISE EXCEPTION USING ERRCODE = 'PB007',
      MESSAGE = format('double texting "%s" is not a policy: give enqueue, reject, interrupt or debounce', policy);
  END IF;
END
$$;
-- +goose StatementEnd

DROP FUNCTION baton_create_conversation(text, text, text);
DROP FUNCTION baton_create_conversation_for_owner(bigint, text, text);
DROP FUNCTION baton_send_message_for_owner(bigint, text, text, text, text);

-- +goose StatementBegin
CREATE FUNCTION baton_create_conversation_for_owner(
  p_owner_id bigint, p_conversation_id text, p_title text, p_double_texting text DEFAULT NULL,
  OUT conversation_key text, OUT existed boolean)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  PERFORM public.baton_check_id('conversation', p_conversation_id);
  IF char_length(p_title) > 500 THEN
    RAISE EXCEPTION USING ERRCODE = 'PB006',
      MESSAGE = format('title is %s characters long: the limit is 500', char_length(p_title));
  END IF;
  PERFORM public.baton_check_double_texting(p_double_texting);
  -- A conversation deleted between the insert that found it and the read
  -- is made anew on the next round.
  LOOP
    INSERT INTO public.conversations AS c (id, public_id, owner_id, title)
    VALUES (public.baton_new_key('c_'), p_conversation_id, p_owner_id, coalesce(p_title, ''))
    ON CONFLICT (owner_id, public_id) DO NOTHING
    RETURNING c.id INTO conversation_key;
    IF FOUND THEN
      -- Without a policy, the column's default holds.
      IF p_double_texting IS NOT NULL THEN
        UPDATE public.conversations SET double_texting = p_double_texting WHERE id = conversation_key;
      END IF;
      existed := false;
      RETURN;
    END IF;
    SELECT c.id INTO conversation_key FROM public.conversations c
    WHERE c.owner_id = p_owner_id AND c.public_id = p_conversation_id;
    IF FOUND THEN
      existed := true;
      RETURN;
    END IF;
  END LOOP;
END
$$;
-- +goose StatementEnd

-- The write path of a user message, as in 00015, with the conversation's
-- double texting applied under the conversation's lock, before anything
-- is written (reject) or in the message's transaction (interrupt).
-- interrupted_run_id names the run this message asked to stop: the caller
-- tells its worker after the commit (the API publishes a stop notice); a
-- worker that hears nothing learns it when the new message's trigger
-- reaches it, or at its next lease renewal.
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

-- The stable contract gains an optional fourth argument, the policy.
-- +goose StatementBegin
CREATE FUNCTION baton_create_conversation(user_id text, conversation_id text, title text DEFAULT '', double_texting text DEFAULT NULL,
  OUT conversation_key text, OUT existed boolean)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  created record;
BEGIN
  -- Checked before the user is made: a refused call makes nothing.
  PERFORM public.baton_check_double_texting(double_texting);
  created := public.baton_create_conversation_for_owner(public.baton_producer_user(user_id, true), conversation_id, title, double_texting);
  conversation_key := created.conversation_key;
  existed := created.existed;
END
$$;
-- +goose StatementEnd

INSERT INTO baton_grants (object, role, privilege, columns, reason) VALUES
  ('baton_check_double_texting', 'baton_api', 'EXECUTE', NULL, 'CreateConversation checks the policy');

-- The API creates conversations with a policy and changes it
-- (SetDoubleTexting); InsertMessageTx interrupts a running turn (its
-- stop), or one that waits for an approval (the call denied, the rows
-- given back for the next turn).
UPDATE baton_grants SET columns = columns || '{double_texting}'
WHERE object = 'conversations' AND role = 'baton_api' AND privilege = 'INSERT' AND NOT columns @> '{double_texting}';
UPDATE baton_grants SET columns = columns || '{double_texting,interrupted_run_id,approval_id}'
WHERE object = 'conversations' AND role = 'baton_api' AND privilege = 'UPDATE' AND NOT columns @> '{double_texting}';
UPDATE baton_grants SET columns = columns || '{turn_id,effect}'
WHERE object = 'operations' AND role = 'baton_api' AND privilege = 'SELECT' AND NOT columns @> '{effect}';
-- A finalize that gives an interrupted turn's rows back gives them one
-- more generation (its reply keeps the old id, the next turn's gets a new
-- one) and marks the partial reply superseded by the one to come.
UPDATE baton_grants SET columns = columns || '{generation}'
WHERE object = 'agent_outbox' AND role = 'baton_worker' AND privilege = 'UPDATE' AND NOT columns @> '{generation}';
UPDATE baton_grants SET columns = columns || '{superseded_at}'
WHERE object = 'messages' AND role = 'baton_worker' AND privilege = 'INSERT' AND NOT columns @> '{superseded_at}';

SELECT baton_apply_grants();

-- +goose Down
UPDATE baton_grants SET columns = array_remove(columns, 'superseded_at')
WHERE object = 'messages' AND role = 'baton_worker' AND privilege = 'INSERT';
UPDATE baton_grants SET columns = array_remove(columns, 'generation')
WHERE object = 'agent_outbox' AND role = 'baton_worker' AND privilege = 'UPDATE';
UPDATE baton_grants SET columns = array_remove(array_remove(columns, 'turn_id'), 'effect')
WHERE object = 'operations' AND role = 'baton_api' AND privilege = 'SELECT';
UPDATE baton_grants SET columns = array_remove(array_remove(array_remove(columns, 'double_texting'), 'interrupted_run_id'), 'approval_id')
WHERE object = 'conversations' AND role = 'baton_api' AND privilege = 'UPDATE';
UPDATE baton_grants SET columns = array_remove(columns, 'double_texting')
WHERE object = 'conversations' AND role = 'baton_api' AND privilege = 'INSERT';
DELETE FROM baton_grants WHERE object = 'baton_check_double_texting';

DROP FUNCTION baton_create_conversation(text, text, text, text);
DROP FUNCTION baton_create_conversation_for_owner(bigint, text, text, text);
DROP FUNCTION baton_send_message_for_owner(bigint, text, text, text, text);
DROP FUNCTION baton_check_double_texting(text);

-- +goose StatementBegin
CREATE FUNCTION baton_create_conversation_for_owner(
  p_owner_id bigint, p_conversation_id text, p_title text,
  OUT conversation_key text, OUT existed boolean)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  PERFORM public.baton_check_id('conversation', p_conversation_id);
  IF char_length(p_title) > 500 THEN
    RAISE EXCEPTION USING ERRCODE = 'PB006',
      MESSAGE = format('title is %s characters long: the limit is 500', char_length(p_title));
  END IF;
  LOOP
    INSERT INTO public.conversations AS c (id, public_id, owner_id, title)
    VALUES (public.baton_new_key('c_'), p_conversation_id, p_owner_id, coalesce(p_title, ''))
    ON CONFLICT (owner_id, public_id) DO NOTHING
    RETURNING c.id INTO conversation_key;
    IF FOUND THEN
      existed := false;
      RETURN;
    END IF;
    SELECT c.id INTO conversation_key FROM public.conversations c
    WHERE c.owner_id = p_owner_id AND c.public_id = p_conversation_id;
    IF FOUND THEN
      existed := true;
      RETURN;
    END IF;
  END LOOP;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION baton_send_message_for_owner(
  p_owner_id bigint, p_conversation_id text, p_message_id text, p_content text, p_trace_parent text,
  OUT conversation_key text, OUT message_key text, OUT outbox_id bigint, OUT message_seq bigint,
  OUT message_created_at timestamptz, OUT outbox_status text, OUT existed boolean)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  stored_conversation text;
  stored_content text;
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
  SELECT c.id INTO conversation_key FROM public.conversations c
  WHERE c.owner_id = p_owner_id AND c.public_id = p_conversation_id
  FOR NO KEY UPDATE;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'PB010',
      MESSAGE = format('no conversation "%s" for this user: create it first with baton_create_conversation (conversation ids are per user)', p_conversation_id);
  END IF;
  INSERT INTO public.messages AS m (id, public_id, owner_id, conversation_id, role, content)
  VALUES (public.baton_new_key('m_'), p_message_id, p_owner_id, conversation_key, 'user', p_content)
  ON CONFLICT (owner_id, public_id) WHERE public_id IS NOT NULL DO NOTHING
  RETURNING m.id, m.seq, m.created_at INTO message_key, message_seq, message_created_at;
  IF FOUND THEN
    INSERT INTO public.agent_outbox AS o (conversation_id, message_id, trace_parent)
    VALUES (conversation_key, message_key, nullif(p_trace_parent, ''))
    RETURNING o.id INTO outbox_id;
    UPDATE public.conversations SET updated_at = now(), last_message_at = now() WHERE id = conversation_key;
    outbox_status := 'pending';
    existed := false;
    RETURN;
  END IF;
  SELECT m.id, m.conversation_id, c.public_id, m.content, m.seq, m.created_at, o.id, o.status
  INTO message_key, conversation_key, stored_conversation, stored_content, message_seq, message_created_at, outbox_id, outbox_status
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
  IF stored_content <> p_content THEN
    RAISE EXCEPTION USING ERRCODE = 'PB011',
      MESSAGE = format('message id "%s" was already used for different content: use a new id for a new message', p_message_id);
  END IF;
  existed := true;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION baton_create_conversation(user_id text, conversation_id text, title text DEFAULT '',
  OUT conversation_key text, OUT existed boolean)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  created record;
BEGIN
  created := public.baton_create_conversation_for_owner(public.baton_producer_user(user_id, true), conversation_id, title);
  conversation_key := created.conversation_key;
  existed := created.existed;
END
$$;
-- +goose StatementEnd

ALTER TABLE conversations DROP COLUMN interrupted_run_id, DROP COLUMN double_texting;
SELECT baton_apply_grants();
