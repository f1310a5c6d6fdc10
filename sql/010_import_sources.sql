-- Imports from a database (`import --sql ... --source NAME`): a source's high-water mark. With
-- a cursor column, the next import reads only rows after (cursor, tenant_id, post_id) of the
-- last row committed; the mark moves in the same transaction as the rows it covers.
-- cursor_value is the cursor's value as JSON ({"type": ..., "value": ...}) so it binds back
-- with its type. rows_read counts every row the source delivered (rejects number from it).
CREATE TABLE import_sources (
    source            TEXT PRIMARY KEY,
    cursor_column     TEXT,
    cursor_value      TEXT,
    cursor_tenant_id  TEXT,
    cursor_post_id    TEXT,
    rows_read         BIGINT NOT NULL,
    updated_at        TIMESTAMP NOT NULL
);
-- Where a rejected row is when its line number alone does not say: a Parquet row, a query's
-- post (its post_id and cursor, never its text).
ALTER TABLE rejected_records ADD COLUMN locator TEXT;
