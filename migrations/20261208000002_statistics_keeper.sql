-- Statistics narad keeps current itself on the tables it grows: a plan
-- made when a table was nearly empty (a sequential scan is cheapest then),
-- cached by a prepared statement, stays that plan while the table grows
-- unless the table's statistics change. A database whose automatic ANALYZE
-- is off (this project's test clusters) or lags a fast-growing table (a
-- production database) then slows down as it fills: a soak on a new
-- database fell from about 200 appends/s to 56/s within four minutes, and
-- one ANALYZE brought it back. The server's sweeper calls this every few
-- seconds: it analyzes each table of the schema changed by more than
-- `p_min_rows` plus `p_fraction` of its rows since it was last analyzed (by
-- anyone: autovacuum resets the count too, so a database that keeps its
-- statistics current itself gets nothing more from this), and answers the
-- tables it analyzed. ANALYZE takes a lock that no insert, update or
-- delete waits for.
create function analyze_grown(p_min_rows bigint, p_fraction double precision)
returns setof text
language plpgsql volatile security definer set search_path = pg_catalog, public, pg_temp
as $$
declare
  t record;
begin
  for t in
    select s.relname
    from pg_stat_user_tables s
    join pg_class c on c.oid = s.relid
    where s.schemaname = 'public'
      and s.n_mod_since_analyze > p_min_rows + p_fraction * greatest(c.reltuples, 0)
    order by s.relname
  loop
    execute format('analyze public.%I', t.relname);
    return next t.relname;
  end loop;
end
$$;
revoke all on function analyze_grown(bigint, double precision) from public;
grant execute on function analyze_grown(bigint, double precision) to narad_app;
