-- ci/preload.sh: runs with and without LD_PRELOAD=libscalemem.so; the output must match.
PRAGMA threads = 4;             -- sorts on worker threads
PRAGMA cache_size = -16000;
CREATE TABLE customers(id INTEGER PRIMARY KEY, name TEXT NOT NULL, region INTEGER NOT NULL);
CREATE TABLE orders(id INTEGER PRIMARY KEY, customer INTEGER NOT NULL REFERENCES customers(id),
                    amount INTEGER NOT NULL, note TEXT);
BEGIN;
WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 20000)
INSERT INTO customers SELECT x, 'customer-' || x, x % 17 FROM c;
WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 100000)
INSERT INTO orders SELECT x, (x * 7919) % 20000 + 1, (x * 104729) % 10007, printf('%.*c', x % 300, 'n') || x FROM c;
COMMIT;
CREATE INDEX orders_customer ON orders(customer);
CREATE INDEX orders_amount_note ON orders(amount, note);
SELECT region, count(*), sum(o.amount), max(length(o.note))
  FROM customers c JOIN orders o ON o.customer = c.id GROUP BY region ORDER BY region;
SELECT c.name, sum(o.amount) AS total
  FROM customers c JOIN orders o ON o.customer = c.id GROUP BY c.id ORDER BY total DESC, c.name LIMIT 20;
SELECT count(*), sum(length(note)), min(note), max(note)
  FROM (SELECT DISTINCT note, amount FROM orders ORDER BY note DESC, amount);
SELECT id, amount, rank() OVER (PARTITION BY customer % 100 ORDER BY amount DESC, id) AS r
  FROM orders WHERE id % 997 = 0 ORDER BY id;
SELECT a.id, b.id FROM orders a JOIN orders b ON a.amount = b.amount AND a.id < b.id
  WHERE a.id < 3000 ORDER BY a.id, b.id LIMIT 50;
UPDATE orders SET note = upper(note) || '!' WHERE amount % 5 = 0;
DELETE FROM orders WHERE amount % 3 = 0;
VACUUM;
PRAGMA integrity_check;
SELECT count(*), sum(amount), sum(length(note)) FROM orders;
