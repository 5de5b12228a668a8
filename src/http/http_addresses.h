/*
 * http_addresses.h -- the network addresses HTTP steps may connect to (docs/http.md,
 * "Security model").
 *
 * Two superuser settings name addresses: the address entries of durable_steps.http_allowed_hosts
 * (a CIDR range, with an optional port: 10.1.0.0/16, 192.0.2.7:8443, [2001:db8::/32]:443) and
 * durable_steps.http_denied_addresses (CIDR ranges). Every connection libcurl opens for an HTTP
 * step is checked against them, at the address the host name resolved to, before it is opened:
 * a name that resolves to a denied address (loopback, link-local, a private range) reaches
 * nothing, whatever the name.
 */
#ifndef DS_HTTP_ADDRESSES_H
#define DS_HTTP_ADDRESSES_H

#include "base/compat.h"

#include <sys/socket.h>

/* One address entry: a range of one family, and a port (0: any). */
typedef struct AddressRule
{
	int			family;			/* AF_INET or AF_INET6 */
	unsigned char addr[16];
	int			bits;
	int			port;
} AddressRule;

/* From _PG_init: durable_steps.http_denied_addresses. */
extern void ds_http_addresses_init_module(void);

/*
 * Parse `entry` -- an address or CIDR range, IPv6 in brackets when a port follows -- into *out;
 * false when it is not one (a host name). `port` is the port after the entry (0: none).
 */
extern bool ds_http_parse_address(const char *entry, int port, AddressRule *out);

/* Does the address (family, bytes; an IPv4-mapped IPv6 address counts as IPv4) match `rule`? */
extern bool ds_http_address_matches(const AddressRule *rule, int family, const unsigned char *addr,
									int port);

/*
 * In the HTTP worker, between transfers: read the settings (durable_steps.http_allowed_hosts is
 * `allowed_hosts`) into the rules the connection
 * check uses (when they changed). The check itself runs inside libcurl and allocates nothing.
 */
extern void ds_http_address_rules_refresh(const char *allowed_hosts);

/*
 * Split a trailing ":port" off a list entry, in place; returns the port, 0 when there is none.
 * An IPv6 entry takes a port only in brackets ([2001:db8::/32]:443).
 */
extern int	ds_http_split_port(char *entry);

/*
 * The connection check, inside libcurl: may a connection go to `sa`? `by_name`: the request's
 * host was allowed by name, so only the denied ranges apply; otherwise an address entry of
 * http_allowed_hosts must match too (when the list is not empty).
 */
extern bool ds_http_connection_allowed(const struct sockaddr *sa, bool by_name);

/*
 * The same check for a connection libcurl opened earlier and reuses, before each request: its
 * peer's address as text, and port (rules may have changed since it was opened).
 */
extern bool ds_http_peer_allowed(const char *ip, int port, bool by_name);

#endif							/* DS_HTTP_ADDRESSES_H */
