-- inbox_partitions lists the inbox's partitions with their bounds (NULL
-- for MINVALUE and MAXVALUE, and both NULL for the default partition),
-- lowest keys first. Reading the catalogs is all it does: any role may.

CREATE OR REPLACE FUNCTION inbox_partitions()
RETURNS TABLE (part REGCLASS, name TEXT, lower_bound UUID, upper_bound UUID)
LANGUAGE sql STABLE AS $$
    SELECT c.oid::regclass, c.relname::text,
        substring(pg_get_expr(c.relpartbound, c.oid) FROM 'FROM \(''([0-9a-f-]+)''\)')::uuid,
        substring(pg_get_expr(c.relpartbound, c.oid) FROM 'TO \(''([0-9a-f-]+)''\)')::uuid
    FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
    WHERE i.inhparent = to_regclass('processed_event')
    ORDER BY 3 NULLS FIRST, c.relname
$$;
