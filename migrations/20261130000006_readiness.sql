-- Readiness (`GET /readyz`) compares the migrations applied with those the
-- running build knows; the application role may read which are applied.
grant select on _sqlx_migrations to narad_app;
