-- The `shop` database of docker-compose.yml's MySQL: the tables deploy/pipelines/inventory.yaml
-- captures (shop.*), with a few rows, so the first snapshot has something to read.
CREATE TABLE products (
    id bigint PRIMARY KEY,
    name varchar(100) NOT NULL,
    price decimal(12, 2) NOT NULL
);
CREATE TABLE stock (
    product_id bigint PRIMARY KEY,
    quantity int NOT NULL,
    updated_at datetime(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
);
INSERT INTO products VALUES (1, 'kettle', 24.90), (2, 'teapot', 31.00), (3, 'mug', 6.50);
INSERT INTO stock (product_id, quantity) VALUES (1, 12), (2, 4), (3, 120);
