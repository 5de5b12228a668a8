/*
 * http_addresses.c -- the network addresses HTTP steps may connect to (http_addresses.h).
 *
 * Entries are parsed with PostgreSQL's own inet parser (pg_inet_net_pton, the parser of the
 * inet type). The rules the connection check reads are plain arrays in the HTTP worker's
 * memory, rebuilt between transfers when a setting changed: libcurl's callback must neither
 * allocate in a memory context nor raise an error.
 */
#include "base/compat.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include "nodes/pg_list.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/inet.h"
#include "utils/varlena.h"

#include "http/http_addresses.h"

static char *denied_addresses = NULL;

/* the rules in force, as last read (malloc'd; NULL when there are none) */
#define MAX_ADDRESS_RULES 256
static AddressRule *denied_rules = NULL;
static int	n_denied = 0;
static AddressRule *allowed_rules = NULL;
static int	n_allowed = 0;
static bool allow_list_set = false;
static char *read_denied = NULL;
static char *read_allowed = NULL;

/* GUC check hook: every entry must be an address or CIDR range. */
static bool
check_denied_addresses(char **newval, void **extra, GucSource source)
{
	char	   *copy = pstrdup(*newval);
	List	   *items;
	ListCell   *lc;

	if (!SplitGUCList(copy, ',', &items))
	{
		GUC_check_errdetail("List syntax is invalid.");
		return false;
	}
	if (list_length(items) > MAX_ADDRESS_RULES)
	{
		GUC_check_errdetail("At most %d entries are allowed.", MAX_ADDRESS_RULES);
		return false;
	}
	foreach(lc, items)
	{
		AddressRule rule;
		char	   *entry = pstrdup((const char *) lfirst(lc));
		int			port = ds_http_split_port(entry);

		if (!ds_http_parse_address(entry, port, &rule))
		{
			GUC_check_errdetail("\"%s\" is not an address or CIDR range.", (const char *) lfirst(lc));
			return false;
		}
	}
	return true;
}

void
ds_http_addresses_init_module(void)
{
	DefineCustomStringVariable("durable_steps.http_denied_addresses",
							   "Network addresses HTTP steps may never connect to.",
							   "A comma-separated list of addresses and CIDR ranges (127.0.0.0/8, ::1/128, 10.0.0.0/8, ...). Checked at the address each connection goes to, after the host name was resolved.",
							   &denied_addresses,
							   "",
							   PGC_SUSET,
							   GUC_LIST_INPUT,
							   check_denied_addresses, NULL, NULL);
}

bool
ds_http_parse_address(const char *entry, int port, AddressRule *out)
{
	char		buf[INET6_ADDRSTRLEN + 8];
	size_t		len = strlen(entry);
	int			bits;

	if (len >= sizeof(buf))
		return false;
	/* [2001:db8::/32] */
	if (len > 2 && entry[0] == '[' && entry[len - 1] == ']')
	{
		memcpy(buf, entry + 1, len - 2);
		buf[len - 2] = '\0';
	}
	else
		strcpy(buf, entry);
	memset(out, 0, sizeof(*out));
	out->family = strchr(buf, ':') != NULL ? AF_INET6 : AF_INET;

	/*
	 * a name is not an address: only digits, dots, colons, hex digits and one
	 * slash are
	 */
	if (strspn(buf, "0123456789abcdefABCDEF.:/") != strlen(buf) ||
		(out->family == AF_INET && strspn(buf, "0123456789./") != strlen(buf)))
		return false;
	bits = pg_inet_net_pton(out->family == AF_INET ? PGSQL_AF_INET : PGSQL_AF_INET6, buf,
							out->addr, -1);
	if (bits < 0 || bits > (out->family == AF_INET ? 32 : 128))
		return false;
	/* an IPv4 address without a range is that one address, not its class */
	if (out->family == AF_INET && strchr(buf, '/') == NULL)
		bits = 32;
	out->bits = bits;
	out->port = port;
	return true;
}

bool
ds_http_address_matches(const AddressRule *rule, int family, const unsigned char *addr, int port)
{
	static const unsigned char v4_mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
	int			full;
	int			rest;

	/* ::ffff:127.0.0.1 is 127.0.0.1 */
	if (family == AF_INET6 && rule->family == AF_INET && memcmp(addr, v4_mapped, 12) == 0)
	{
		family = AF_INET;
		addr += 12;
	}
	if (family != rule->family || (rule->port != 0 && rule->port != port))
		return false;
	full = rule->bits / 8;
	rest = rule->bits % 8;
	if (memcmp(addr, rule->addr, full) != 0)
		return false;
	return rest == 0 ||
		((addr[full] ^ rule->addr[full]) & (unsigned char) (0xff << (8 - rest))) == 0;
}

int
ds_http_split_port(char *entry)
{
	char	   *colon = strrchr(entry, ':');
	int			port;

	if (colon == NULL || colon[1] == '\0' || strspn(colon + 1, "0123456789") != strlen(colon + 1))
		return 0;

	/*
	 * 2001:db8::1 is an address, not an address and a port; [2001:db8::1]:443
	 * is one with a port
	 */
	if (entry[0] == '[' ? colon[-1] != ']' : memchr(entry, ':', colon - entry) != NULL)
		return 0;
	port = atoi(colon + 1);
	if (strlen(colon + 1) > 5 || port < 1 || port > 65535)
		return 0;
	*colon = '\0';
	return port;
}

/* Read `list` into a malloc'd array of its address entries (ports after ':' where given). */
static int
read_rules(const char *list, AddressRule **rules)
{
	char	   *copy = pstrdup(list ? list : "");
	List	   *items = NIL;
	ListCell   *lc;
	int			n = 0;

	free(*rules);
	*rules = malloc(sizeof(AddressRule) * MAX_ADDRESS_RULES);
	if (*rules == NULL)
		elog(ERROR, "out of memory");
	(void) SplitGUCList(copy, ',', &items);
	foreach(lc, items)
	{
		char	   *entry = pstrdup((const char *) lfirst(lc));
		int			port = ds_http_split_port(entry);

		if (n < MAX_ADDRESS_RULES && ds_http_parse_address(entry, port, &(*rules)[n]))
			n++;
	}
	return n;
}

/* Has setting `value` changed since it was read into *read? */
static bool
changed(const char *value, char **read)
{
	const char *v = value ? value : "";

	if (*read != NULL && strcmp(*read, v) == 0)
		return false;
	free(*read);
	*read = strdup(v);
	if (*read == NULL)
		elog(ERROR, "out of memory");
	return true;
}

void
ds_http_address_rules_refresh(const char *allowed)
{
	if (changed(denied_addresses, &read_denied))
		n_denied = read_rules(denied_addresses, &denied_rules);
	if (changed(allowed, &read_allowed))
	{
		n_allowed = read_rules(allowed, &allowed_rules);
		allow_list_set = allowed != NULL && allowed[0] != '\0';
	}
}

/* The family, bytes and port of a socket address; false for another family. */
static bool
address_of(const struct sockaddr *sa, int *family, const unsigned char **addr, int *port)
{
	if (sa->sa_family == AF_INET)
	{
		const struct sockaddr_in *in = (const struct sockaddr_in *) sa;

		*family = AF_INET;
		*addr = (const unsigned char *) &in->sin_addr;
		*port = ntohs(in->sin_port);
		return true;
	}
	if (sa->sa_family == AF_INET6)
	{
		const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *) sa;

		*family = AF_INET6;
		*addr = (const unsigned char *) &in6->sin6_addr;
		*port = ntohs(in6->sin6_port);
		return true;
	}
	return false;
}

bool
ds_http_connection_allowed(const struct sockaddr *sa, bool by_name)
{
	int			family;
	const unsigned char *addr;
	int			port;
	bool		allowed;

	if (!address_of(sa, &family, &addr, &port))
		return false;			/* HTTP steps go over IP only */
	for (int i = 0; i < n_denied; i++)
		if (ds_http_address_matches(&denied_rules[i], family, addr, port))
			return false;
	if (by_name || !allow_list_set)
		return true;
	allowed = false;
	for (int i = 0; i < n_allowed && !allowed; i++)
		allowed = ds_http_address_matches(&allowed_rules[i], family, addr, port);
	return allowed;
}

bool
ds_http_peer_allowed(const char *ip, int port, bool by_name)
{
	struct sockaddr_in6 in6;
	struct sockaddr_in in;

	memset(&in, 0, sizeof(in));
	memset(&in6, 0, sizeof(in6));
	if (inet_pton(AF_INET, ip, &in.sin_addr) == 1)
	{
		in.sin_family = AF_INET;
		in.sin_port = htons((uint16) port);
		return ds_http_connection_allowed((const struct sockaddr *) &in, by_name);
	}
	if (inet_pton(AF_INET6, ip, &in6.sin6_addr) == 1)
	{
		in6.sin6_family = AF_INET6;
		in6.sin6_port = htons((uint16) port);
		return ds_http_connection_allowed((const struct sockaddr *) &in6, by_name);
	}
	return false;
}
