/*
 * interval_bounds.h -- a timestamp plus or minus an interval that may reach past the first or
 * the last timestamp (interval_bounds.c): an argument the caller must refuse with its own
 * SQLSTATE and name, rather than let PostgreSQL's arithmetic raise 22008 from inside.
 */
#ifndef DS_INTERVAL_BOUNDS_H
#define DS_INTERVAL_BOUNDS_H

#include "base/compat.h"
#include "datatype/timestamp.h"

/*
 * t + i (`sign` 1) or t - i (`sign` -1) into *out; false when the result would be out of the
 * range of timestamptz or infinite (an infinite interval, from PostgreSQL 17).
 */
extern bool ds_timestamptz_shift(TimestampTz t, const Interval *i, int sign, TimestampTz *out);

#endif							/* DS_INTERVAL_BOUNDS_H */
