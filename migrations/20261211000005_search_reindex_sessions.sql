-- no-transaction
-- sessions_search again with the bounded documents of 20261211000003.
reindex index concurrently sessions_search;
