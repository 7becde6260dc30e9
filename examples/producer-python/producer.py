"""A shop's backend asks Baton's agent about a customer's support request.

It records the request in its own table and sends the message to Baton in
the same transaction, so both commit or neither does
(docs/guides/producing.md). psycopg 3, as Debian packages it
(python3-psycopg):

    DATABASE_URL=postgres://shop:...@db/baton python3 producer.py start USER CONVERSATION [TITLE]
    DATABASE_URL=postgres://shop:...@db/baton python3 producer.py send USER CONVERSATION MESSAGE_ID TEXT

TEXT "-" reads the text from standard input. USER is the user's name in
Baton: NAME of `baton token create --user NAME`, or <iss>|<sub> of a user
who signs in with a JWT.
"""

import json
import os
import sys

import psycopg


def start(conn, user_id, conversation_id, title=""):
    """The conversation, made when the user has none of that id."""
    with conn.transaction():
        key, existed = conn.execute(
            "SELECT conversation_key, existed FROM baton_create_conversation(%s, %s, %s)",
            (user_id, conversation_id, title),
        ).fetchone()
    return {"conversation_key": key, "existed": existed}


def send(conn, user_id, conversation_id, message_id, text):
    """The shop's row and the message, in one transaction.

    A retry with the same message id and text changes nothing and says
    existed.
    """
    content = sys.stdin.buffer.read().decode("utf-8") if text == "-" else text
    with conn.transaction():
        key, existed = conn.execute(
            "SELECT message_key, existed FROM baton_send_message(%s, %s, %s, %s)",
            (user_id, conversation_id, message_id, content),
        ).fetchone()
        conn.execute(
            """INSERT INTO support_requests (customer, message_id, conversation_id, message_key)
               VALUES (%s, %s, %s, %s)
               ON CONFLICT (customer, message_id) DO NOTHING""",
            (user_id, message_id, conversation_id, key),
        )
    return {"message_key": key, "existed": existed}


def main():
    commands = {"start": (start, 2, 3), "send": (send, 4, 4)}
    args = sys.argv[2:]
    command = commands.get(sys.argv[1] if len(sys.argv) > 1 else "")
    if command is None or not command[1] <= len(args) <= command[2] or not os.environ.get("DATABASE_URL"):
        print("usage: DATABASE_URL=... python3 producer.py start USER CONVERSATION [TITLE]", file=sys.stderr)
        print("       DATABASE_URL=... python3 producer.py send USER CONVERSATION MESSAGE_ID TEXT|-", file=sys.stderr)
        return 2
    try:
        with psycopg.connect(os.environ["DATABASE_URL"]) as conn:
            print(json.dumps(command[0](conn, *args)))
    except psycopg.Error as err:
        # Baton's errors carry a SQLSTATE of class PB and say what to fix.
        message = err.diag.message_primary or str(err)
        print(f"{err.sqlstate}: {message}" if err.sqlstate else message, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
