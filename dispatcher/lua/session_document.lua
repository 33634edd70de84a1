-- requires: session_document_lib
-- A whole session, read-only (`Client.export`, `parley export`): run with EVAL_RO, so it runs on
-- a replica and under a Redis user that may write nothing. Loaded with session_document_lib.lua
-- prepended (parley/client/export.py), the function that also builds the archive entry a close
-- writes: an export and an archived document are the same document by construction.
-- KEYS[1] meta hash, KEYS[2] messages hash, KEYS[3] events stream (all of one session)
-- ARGV[1] the session id
-- Returns the session's raw document, a JSON string (its "core" is null: no such session).
return session_document(KEYS[1], KEYS[2], KEYS[3], ARGV[1])
