package fence

import (
	"context"
	"database/sql"
	"errors"

	"github.com/jackc/pgx/v5"
)

// DB is where the helpers run: a database/sql or a pgx connection, pool
// or transaction, wrapped by [SQL] or [Pgx]. Pass the transaction of the
// write the helper fences, so that the check and the effect commit
// together.
type DB interface {
	queryRow(ctx context.Context, query string, args ...any) scanner
	query(ctx context.Context, query string, args ...any) (rows, error)
}

// SQLQuerier is what [SQL] takes: *sql.DB, *sql.Conn and *sql.Tx all are
// (with any PostgreSQL driver for database/sql, pgx's stdlib among them).
type SQLQuerier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// PgxQuerier is what [Pgx] takes: *pgx.Conn, pgx.Tx and *pgxpool.Pool
// all are.
type PgxQuerier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// SQL runs the helpers on a database/sql connection, pool or transaction.
func SQL(q SQLQuerier) DB { return sqlDB{q} }

// Pgx runs the helpers on a pgx connection, pool or transaction.
func Pgx(q PgxQuerier) DB { return pgxDB{q} }

type scanner interface{ Scan(dest ...any) error }

type rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close()
}

type sqlDB struct{ q SQLQuerier }

func (d sqlDB) queryRow(ctx context.Context, query string, args ...any) scanner {
	return d.q.QueryRowContext(ctx, query, args...)
}

func (d sqlDB) query(ctx context.Context, query string, args ...any) (rows, error) {
	r, err := d.q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return sqlRows{r}, nil
}

type sqlRows struct{ *sql.Rows }

func (r sqlRows) Close() { _ = r.Rows.Close() }

type pgxDB struct{ q PgxQuerier }

func (d pgxDB) queryRow(ctx context.Context, query string, args ...any) scanner {
	return d.q.QueryRow(ctx, query, args...)
}

func (d pgxDB) query(ctx context.Context, query string, args ...any) (rows, error) {
	return d.q.Query(ctx, query, args...)
}

// noRows says whether err is either driver's "no rows".
func noRows(err error) bool {
	return errors.Is(err, sql.ErrNoRows) || errors.Is(err, pgx.ErrNoRows)
}
