-- no-transaction
-- events_search again with the bounded documents of 20261211000003.
reindex index concurrently events_search;
