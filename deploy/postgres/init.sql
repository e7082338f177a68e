-- The `shop` database of docker-compose.yml: the tables deploy/pipelines/orders.yaml
-- captures (public.*), with a few rows, so the first snapshot has something to read.
CREATE TABLE customers (
    id bigint PRIMARY KEY,
    name text NOT NULL,
    email text UNIQUE
);
CREATE TABLE orders (
    id bigint PRIMARY KEY,
    customer_id bigint NOT NULL REFERENCES customers (id),
    total numeric(12, 2) NOT NULL,
    status text NOT NULL DEFAULT 'new',
    created_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO customers VALUES (1, 'Ada', 'ada@example.com'), (2, 'Grace', 'grace@example.com');
INSERT INTO orders (id, customer_id, total) VALUES (1, 1, 12.50), (2, 2, 99.00), (3, 1, 7.25);
