-- How many of its 16 partitions a tenant uses: 2^slice_level (issue 10). A post's stored slice
-- never changes; its partition is slice mod 2^slice_level, so partitions only split as the
-- level rises (the import raises it when a tenant outgrows BACKFILL_SLICE_TARGET_POSTS per
-- partition; it never falls). NULL (tenants imported before this migration) means all 16.
ALTER TABLE tenants ADD COLUMN slice_level INTEGER;
