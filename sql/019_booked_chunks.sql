-- A batch chunk whose lines are in the ledger is 'booked', no longer 'applied': to apply is to
-- write verified labels onto the posts, and one word keeps one meaning. The state value and
-- its timestamp column (applied_at -> booked_at) are renamed in place.
-- Statements starting with @postgresql or @sqlite run on that store only. PostgreSQL swaps the
-- CHECK constraint. SQLite cannot alter one; it edits the table's definition instead, the
-- procedure SQLite documents for a change that leaves every stored row readable as it is
-- (https://www.sqlite.org/lang_altertable.html#otheralter), and bumps the schema version so
-- every connection reads the new definition.
@postgresql ALTER TABLE batch_submissions DROP CONSTRAINT batch_submissions_state_check;
@sqlite PRAGMA writable_schema = ON;
@sqlite UPDATE sqlite_master SET sql = replace(sql, '''applied''', '''booked''')
    WHERE type = 'table' AND name = 'batch_submissions';
@sqlite PRAGMA schema_version = {next_schema_version};
@sqlite PRAGMA writable_schema = OFF;
UPDATE batch_submissions SET state = 'booked' WHERE state = 'applied';
@postgresql ALTER TABLE batch_submissions ADD CONSTRAINT batch_submissions_state_check
    CHECK (state IN ('intent', 'uploaded', 'submitted', 'ended', 'booked', 'failed', 'requeued',
                     'abandoned'));
ALTER TABLE batch_submissions RENAME COLUMN applied_at TO booked_at;
