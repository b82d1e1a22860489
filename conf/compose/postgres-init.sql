-- Run once by the postgres image on an empty data directory (docker-compose.yml): the example
-- payment service keeps its table in a database of its own, next to the gateway's `idem`.
CREATE DATABASE payments OWNER idem;
