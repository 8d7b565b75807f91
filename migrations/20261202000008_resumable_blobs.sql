-- Resumable uploads: the length an upload announced (Upload-Length), so
-- that the bytes may arrive over several requests, each resuming at the
-- offset stored so far.
alter table blobs add column upload_length bigint;
